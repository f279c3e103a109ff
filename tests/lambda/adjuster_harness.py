"""Helpers for the capacity-adjuster tests: real-shape events, moto groups, and the queue.

Where moto cannot model a state we reach into its backend, and say so here:
- moto always fills a group to its desired capacity, so a *failed launch* (desired 4, only 3
  instances ever came to be) is modelled by removing instances from the group's backend
  list and terminating them in EC2 (:func:`drop_instances`);
- moto only knows InService/Standby lifecycle states, so Pending, Pending:Wait and
  Terminating are set on the backend object (:func:`set_lifecycle_state`).
Health (``set_instance_health``) and Standby (``enter_standby``) use moto's real APIs.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from tests.support.quotas import operator_quotas

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ACCOUNT = "123456789012"
REGION = "us-east-1"
CLUSTER_ID = "DLClusterStack"
CLUSTER_TAG_KEY = "dl-cluster:id"
ROLE_TAG_KEY = "NodeType"

FIXTURE_BY_EVENT = {
    "autoscaling:EC2_INSTANCE_LAUNCH": "launch.json",
    "autoscaling:EC2_INSTANCE_LAUNCH_ERROR": "launch_error.json",
    "autoscaling:EC2_INSTANCE_TERMINATE": "terminate.json",
    "autoscaling:EC2_INSTANCE_TERMINATE_ERROR": "terminate_error.json",
    "autoscaling:TEST_NOTIFICATION": "test_notification.json",
}
#: Lifecycle-hook notifications (no "Event" key; "LifecycleTransition" instead).
LIFECYCLE_FIXTURES = {
    "autoscaling:EC2_INSTANCE_TERMINATING": "lifecycle_terminating.json",
}
ALL_FIXTURES = {**FIXTURE_BY_EVENT, **LIFECYCLE_FIXTURES}
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
LAUNCH = "autoscaling:EC2_INSTANCE_LAUNCH"
LAUNCH_ERROR = "autoscaling:EC2_INSTANCE_LAUNCH_ERROR"
TERMINATE = "autoscaling:EC2_INSTANCE_TERMINATE"
TERMINATE_ERROR = "autoscaling:EC2_INSTANCE_TERMINATE_ERROR"
TEST_NOTIFICATION = "autoscaling:TEST_NOTIFICATION"


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def fixture_record(event: str, group: str, instance_id: str | None = None) -> dict[str, Any]:
    """One SNS record of the fixture for ``event``, retargeted at ``group`` (and instance)."""
    record = copy.deepcopy(load_fixture(ALL_FIXTURES[event])["Records"][0])
    message = json.loads(record["Sns"]["Message"])
    old_group = message["AutoScalingGroupName"]
    message["AutoScalingGroupName"] = group
    if "AutoScalingGroupARN" in message:  # lifecycle notifications carry only the name
        message["AutoScalingGroupARN"] = message["AutoScalingGroupARN"].replace(old_group, group)
    if instance_id is not None and "EC2InstanceId" in message:
        old_id = message["EC2InstanceId"]
        message["EC2InstanceId"] = instance_id
        if old_id and "Description" in message:
            message["Description"] = message["Description"].replace(old_id, instance_id)
        if old_id:
            record["Sns"]["Subject"] = record["Sns"]["Subject"].replace(old_id, instance_id)
    record["Sns"]["Message"] = json.dumps(message, separators=(",", ":"))
    record["Sns"]["Subject"] = record["Sns"]["Subject"].replace(old_group, group)
    return record


def lifecycle_record(
    group: str, instance_id: str, *, token: str = "71514b9d-6a40-4b26-8523-05e7ee35fa40",
    hook: str = "drain",
) -> dict[str, Any]:
    """A terminating lifecycle-hook notification for ``instance_id`` with this token."""
    record = fixture_record(TERMINATING, group, instance_id)
    message = json.loads(record["Sns"]["Message"])
    message["LifecycleActionToken"] = token
    message["LifecycleHookName"] = hook
    record["Sns"]["Message"] = json.dumps(message, separators=(",", ":"))
    return record


def sns_event(*records: dict[str, Any]) -> dict[str, Any]:
    return {"Records": list(records)}


def lambda_environment(monkeypatch: Any, queue_url: str, **overrides: str) -> None:
    env = {
        "MASTER_QUEUE_URL": queue_url,
        "CLUSTER_ID": CLUSTER_ID,
        "CLUSTER_TAG_KEY": CLUSTER_TAG_KEY,
        "ROLE_TAG_KEY": ROLE_TAG_KEY,
        "LOG_LEVEL": "DEBUG",
        **overrides,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)


class Cloud:
    """boto3 clients plus helpers to build a cluster's groups in moto."""

    def __init__(self, endpoint_url: str | None = None, *, operator: bool = True) -> None:
        """``operator``: the account's vCPU quotas were raised (False: a new account's)."""
        import boto3

        kwargs: dict[str, Any] = {"region_name": REGION}
        if endpoint_url:
            kwargs["endpoint_url"] = endpoint_url
        self.asg = boto3.client("autoscaling", **kwargs)
        self.ec2 = boto3.client("ec2", **kwargs)
        self.sqs = boto3.client("sqs", **kwargs)
        self._template: str | None = None
        if operator:  # the groups' launches fit the account's vCPU quotas
            operator_quotas(endpoint_url)

    def queue(self, name: str = "DLClusterStack-master") -> str:
        return self.sqs.create_queue(QueueName=name)["QueueUrl"]

    def _launch_template(self) -> str:
        if self._template is None:
            image = "ami-12c6146b"  # one of the AMIs moto ships (no slow describe_images)
            self.ec2.create_launch_template(
                LaunchTemplateName="dl-node",
                LaunchTemplateData={"ImageId": image, "InstanceType": "t3.micro"},
            )
            self._template = "dl-node"
        return self._template

    def group(
        self,
        name: str,
        *,
        min_size: int,
        desired: int,
        max_size: int,
        role: str | None = "Worker",
        cluster_id: str | None = CLUSTER_ID,
    ) -> list[str]:
        """Create a group (tags like the stack's) and return its instance ids."""
        tags = []
        if cluster_id is not None:
            tags.append((CLUSTER_TAG_KEY, cluster_id))
        if role is not None:
            tags.append((ROLE_TAG_KEY, role))
        self.asg.create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateName": self._launch_template(), "Version": "$Latest"},
            MinSize=min_size,
            MaxSize=max_size,
            DesiredCapacity=desired,
            AvailabilityZones=[f"{REGION}a"],
            Tags=[
                {
                    "ResourceId": name,
                    "ResourceType": "auto-scaling-group",
                    "Key": key,
                    "Value": value,
                    "PropagateAtLaunch": True,
                }
                for key, value in tags
            ],
        )
        return self.instance_ids(name)

    def describe(self, name: str) -> dict[str, Any]:
        return self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
            "AutoScalingGroups"
        ][0]

    def desired(self, name: str) -> int:
        return int(self.describe(name)["DesiredCapacity"])

    def instance_ids(self, name: str) -> list[str]:
        return sorted(i["InstanceId"] for i in self.describe(name)["Instances"])

    def messages(self, queue_url: str) -> list[dict[str, Any]]:
        """Drain the queue (as the master agent would) and return the decoded bodies."""
        bodies: list[dict[str, Any]] = []
        while True:
            response = self.sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            batch = response.get("Messages", [])
            if not batch:
                return bodies
            for message in batch:
                bodies.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


def backend_group(name: str) -> Any:
    from moto.autoscaling.models import autoscaling_backends

    return autoscaling_backends[ACCOUNT][REGION].autoscaling_groups[name]


def drop_instances(name: str, count: int) -> list[str]:
    """Model ``count`` failed launches: those instances never existed, desired stays."""
    from moto.ec2.models import ec2_backends

    group = backend_group(name)
    dropped = group.instance_states[-count:]
    group.instance_states = group.instance_states[:-count]
    ids = [state.instance.id for state in dropped]
    ec2_backends[ACCOUNT][REGION].terminate_instances(ids)
    return ids


def set_lifecycle_state(name: str, instance_id: str, state: str) -> None:
    """Set a lifecycle state moto cannot reach by itself (Pending, Pending:Wait, ...)."""
    for instance_state in backend_group(name).instance_states:
        if instance_state.instance.id == instance_id:
            instance_state.lifecycle_state = state
            return
    raise KeyError(f"{instance_id} is not in group {name}")


def import_adjuster() -> Any:
    """The handler module, imported as the package module tests and tools use."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from lambda_src import capacity_adjuster

    return capacity_adjuster


def log_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty stdout line must be one JSON object."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]

"""Auto Scaling notifications, as AWS would send them, delivered to the real Lambda handler.

moto cannot run Lambda code without Docker, and its CloudFormation creates no Lambda
subscription. So this module plays the topic's subscription: :class:`TopicSubscription`
takes what Auto Scaling published to the cluster's topic in the emulator's moto (the
lifecycle-hook notifications, and the launches and terminations of the group's own
decisions: ``emulator.moto_extensions``) and :class:`LambdaInvoker` calls
``lambda_src.capacity_adjuster.handler`` in this process with the SNS event (
``Records[].Sns.Message`` is the notification as a JSON *string*; see
``lambda_src/asg_notifications.py`` and ``tests/lambda/fixtures/``), with the environment read
from the DEPLOYED function's configuration, so a drift between construct and code shows here.

The notifications of the instances launched with the group during the deploy (and the
launches the demo fails) are built here by the demo (:func:`notification`): moto launches
them inside CreateAutoScalingGroup, before the emulator knows the group's configuration.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from emulator.deploy import ACCOUNT, REGION

LAUNCH = "autoscaling:EC2_INSTANCE_LAUNCH"
LAUNCH_ERROR = "autoscaling:EC2_INSTANCE_LAUNCH_ERROR"
TERMINATE = "autoscaling:EC2_INSTANCE_TERMINATE"

_SUBJECT = {LAUNCH: "launch", LAUNCH_ERROR: "failed launch", TERMINATE: "termination"}


def _group_arn(group: str) -> str:
    return (f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:"
            f"{uuid.uuid5(uuid.NAMESPACE_DNS, group)}:autoScalingGroupName/{group}")
INSUFFICIENT_CAPACITY = ("We currently do not have sufficient {type} capacity in the "
                         "Availability Zone you requested (us-east-1a). Our system will be "
                         "working on provisioning additional capacity. Launching EC2 instance "
                         "failed.")
#: EC2's text for a launch over the account's vCPU quota: a final cause (retries fail alike).
VCPU_LIMIT = ("You have requested more vCPU capacity than your current vCPU limit of {limit} "
              "allows for the instance bucket that the specified instance type belongs to. "
              "Please visit http://aws.amazon.com/contact-us/ec2-request to request an "
              "adjustment to this limit. Launching EC2 instance failed.")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def notification(event: str, group: str, *, instance_id: str = "", desired: int = 0,
                 instance_type: str = "", cause: str = "", status_message: str = "") -> dict:
    """The Auto Scaling notification document (what ``Sns.Message`` carries); a launch
    error's ``status_message`` defaults to EC2's insufficient-capacity text."""
    activity = str(uuid.uuid4())
    if event == LAUNCH_ERROR:
        status_message = status_message or INSUFFICIENT_CAPACITY.format(
            type=instance_type or "the requested")
        description = f"Launching a new EC2 instance.  Status Reason: {status_message}"
        status = "Failed"
    elif event == LAUNCH:
        description = f"Launching a new EC2 instance: {instance_id}"
        status = "InProgress"
    else:
        description = f"Terminating EC2 instance: {instance_id}"
        status = "InProgress"
    return {
        "Origin": "EC2" if event != TERMINATE else "AutoScalingGroup",
        "Destination": "AutoScalingGroup" if event != TERMINATE else "EC2",
        "Progress": 50 if status == "InProgress" else 100,
        "AccountId": ACCOUNT,
        "AutoScalingGroupARN": _group_arn(group),
        "Service": "AWS Auto Scaling",
        "AutoScalingGroupName": group,
        "Description": description,
        "RequestId": activity,
        "ActivityId": activity,
        "StartTime": _now(),
        "EndTime": _now(),
        "Time": _now(),
        "EC2InstanceId": instance_id,
        "StatusCode": status,
        "StatusMessage": status_message,
        "Details": {"Subnet ID": "subnet-emulated", "Availability Zone": f"{REGION}a"},
        "Cause": cause or (f"At {_now()} an instance was started in response to a difference "
                           f"between desired and actual capacity, increasing the capacity to "
                           f"{desired}." if event != TERMINATE else
                           f"At {_now()} an instance was taken out of service in response to "
                           f"a user request."),
        "Event": event,
    }


TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"


TEST_NOTIFICATION = "autoscaling:TEST_NOTIFICATION"


def lifecycle_notification(group: str, instance_id: str, *, hook: str = "drain",
                           token: str = "", metadata: str | None = None) -> dict:
    """A termination lifecycle-hook notification, as Auto Scaling publishes it to the hook's
    SNS topic (no ``Event`` key: ``LifecycleTransition`` says what happens;
    ``NotificationMetadata`` only when the hook has metadata)."""
    message = {
        "Origin": "AutoScalingGroup", "Destination": "EC2",
        "LifecycleHookName": hook, "AccountId": ACCOUNT,
        "RequestId": str(uuid.uuid4()),
        "LifecycleTransition": TERMINATING,
        "AutoScalingGroupName": group, "Service": "AWS Auto Scaling", "Time": _now(),
        "EC2InstanceId": instance_id,
        "LifecycleActionToken": token or str(uuid.uuid4()),
    }
    if metadata:
        message["NotificationMetadata"] = metadata
    return message


def test_notification(group: str) -> dict:
    """What Auto Scaling publishes to a target when a hook or notification configuration
    naming it is created."""
    return {"AccountId": ACCOUNT, "RequestId": str(uuid.uuid4()),
            "AutoScalingGroupARN": _group_arn(group), "AutoScalingGroupName": group,
            "Service": "AWS Auto Scaling", "Event": TEST_NOTIFICATION, "Time": _now()}


def subject(message: dict) -> str:
    """The SNS subject Auto Scaling gives ``message``."""
    if "LifecycleTransition" in message:
        what = message["LifecycleTransition"].rsplit("_", 1)[-1]
        return (f"Auto Scaling:  Lifecycle action '{what}' for instance "
                f"{message['EC2InstanceId']} in progress.")
    what = _SUBJECT.get(message.get("Event", ""), "test notification")
    return f"Auto Scaling: {what} for group \"{message['AutoScalingGroupName']}\""


def sns_event(topic_arn: str, *messages: dict) -> dict:
    """A Lambda SNS event with one record per notification."""
    records = []
    for message in messages:
        records.append({
            "EventSource": "aws:sns",
            "EventVersion": "1.0",
            "EventSubscriptionArn": f"{topic_arn}:{uuid.uuid4()}",
            "Sns": {
                "Type": "Notification",
                "MessageId": str(uuid.uuid4()),
                "TopicArn": topic_arn,
                "Subject": subject(message),
                "Message": json.dumps(message, separators=(",", ":")),
                "Timestamp": _now(),
                "SignatureVersion": "1",
                "Signature": "EMULATED",
                "SigningCertUrl": "https://sns.us-east-1.amazonaws.com/emulated.pem",
                "UnsubscribeUrl": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
                "MessageAttributes": {},
            },
        })
    return {"Records": records}


@dataclass
class _Context:
    """The part of the Lambda context object the handler reads."""

    aws_request_id: str
    function_name: str


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class LambdaInvoker:
    """Calls the handler in-process; its JSON log lines go to ``log``."""

    def __init__(self, function_name: str, function_env: dict[str, str], aws: dict[str, str],
                 log: Path) -> None:
        self.function_name = function_name
        self.env = {**aws, **function_env}
        self.log = log
        self.invocations: list[dict] = []

    def deliver(self, topic_arn: str, *messages: dict) -> dict:
        from lambda_src import capacity_adjuster

        event = sns_event(topic_arn, *messages)
        out = io.StringIO()
        with _environment(self.env), contextlib.redirect_stdout(out):
            result = capacity_adjuster.handler(
                event, _Context(str(uuid.uuid4()), self.function_name))
        with open(self.log, "a") as fh:
            fh.write(out.getvalue())
        record = {"events": [m.get("Event") or m.get("LifecycleTransition", "")
                             for m in messages],
                  "instances": [m.get("EC2InstanceId", "") for m in messages],
                  "group": messages[0]["AutoScalingGroupName"] if messages else "",
                  "outcomes": list(result.get("outcomes", [])),
                  "error": result.get("error", "")}
        self.invocations.append(record)
        return record


class TopicSubscription:
    """The topic's Lambda subscription: every message published to ``topic_arn`` in the
    emulator's moto (``GET /published`` on its control endpoint), in order, each delivered
    to the handler in one invocation, as SNS invokes a subscribed function."""

    def __init__(self, control: str, topic_arn: str, invoker: LambdaInvoker) -> None:
        self.control = control
        self.topic_arn = topic_arn
        self.invoker = invoker
        self.after = 0

    def pump(self) -> list[dict]:
        """Deliver what was published since the last call; the invocation records."""
        with urllib.request.urlopen(f"{self.control}/published?after={self.after}",
                                    timeout=10) as resp:
            items = json.loads(resp.read())
        out = []
        for item in items:
            self.after = max(self.after, int(item["seq"]))
            if item["topic_arn"] == self.topic_arn:
                out.append(self.invoker.deliver(self.topic_arn, json.loads(item["message"])))
        return out

"""The AWS side of DLClusterStack created directly in moto, in a fraction of a second.

The demo deploys the real stack with the CDK CLI (``emulator.deploy``: synth and deploy take
~20 s on a small machine). Test suites that need a cluster's AWS side per test create it
here instead. What :func:`create_cluster` makes mirrors ``constructs_lib.DeepLearningCluster``
(change the two together):

- the VPC ``127.20.0.0/16`` (``address_space.vpc_cidr``, the emulator's ``-c vpcCidr``: moto
  then hands out loopback addresses an emulated node can bind) with two public and two
  private /18 subnets; both groups launch in the first private one (one AZ, as the stack
  places them);
- per role a launch template, IMDSv2 required (hop limit 2), whose user data ends with the
  line that runs ``bootstrap_scripts.agent.install`` with the settings the construct passes,
  so an emulated node boots from it exactly as from a deployed template
  (:meth:`ClusterResources.install_args`, read back like ``emulator.deploy`` reads it);
- the master group (1/1/1) and the worker group (``min_workers``..``max_workers``), tagged
  ``NodeType=Master|Worker`` and ``dl-cluster:id`` (propagated to instances); the worker
  group has the ``drain`` termination lifecycle hook on the cluster's topic (moto stores it
  but never holds an instance in it, and has no notification configurations: the stack's
  four Auto Scaling notifications are not configured here);
- the master queue with its dead-letter queue (after 5 receives);
- first, the operator's vCPU quota increases
  (``emulator.service_quotas.request_operator_increases``): the emulator refuses launches
  above a new account's quotas as EC2 does (``emulator.vcpu_quotas``).

The stack's defaults it uses (mount point, setup timeout, fewest workers, the drain hook's
name and heartbeat) are read from the constructs' one source (:func:`stack_defaults`), not
restated here.

Not created: EFS (a directory), the Lambda, the wait condition. The Lambda's messages come
from its own code: :meth:`ClusterResources.setup_message` and friends use the builders in
``lambda_src.master_messages`` on the group state ``lambda_src.group_state`` reads, as the
handler does (to run the handler itself, see ``emulator.notifications``); the wait condition
is ``emulator.wait_handle``.

:func:`loopback_instances` hands out instance ids and addresses without moto, for suites
whose nodes need no AWS API at all (the job runner's).
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import os
import shlex
import uuid
from dataclasses import dataclass, field

from emulator import service_quotas
from emulator.address_space import loopback_prefix, subnets, vpc_cidr
from emulator.deploy import (
    CLUSTER_TAG_KEY,
    INSTALL_MODULE,
    REGION,
    ROLE_TAG_KEY,
    Instance,
    group_user_data,
    install_args_from_user_data,
)

ROLE_TAGS = {"master": "Master", "worker": "Worker"}


@dataclass(frozen=True)
class StackDefaults:
    """The defaults a deployed stack has, read from the one description of its settings
    (``constructs_lib.cluster_settings``) and the construct's constants, never restated here."""

    mount_point: str
    setup_timeout: int
    min_workers: int
    drain_heartbeat: int
    drain_hook: str


@functools.cache
def stack_defaults() -> StackDefaults:
    """Imported on first use: the constructs load the CDK (a second or so), which suites that
    only need :func:`loopback_instances` never pay."""
    from constructs_lib import cluster, node_group
    from constructs_lib.cluster_settings import ClusterSettings
    from constructs_lib.setting import default_of

    return StackDefaults(mount_point=default_of(ClusterSettings, "efs_mount_point"),
                         setup_timeout=cluster.SETUP_TIMEOUT_SECONDS,
                         min_workers=cluster.DEFAULT_MIN_WORKERS,
                         drain_heartbeat=node_group.DRAIN_HEARTBEAT_SECONDS,
                         drain_hook=node_group.DRAIN_HOOK_NAME)


def agent_settings(role: str, *, cluster_id: str, master_queue_url: str = "",
                   stack_name: str = "", region: str = REGION, efs_id: str = "",
                   mount_point: str | None = None, wait_handle: str = "",
                   setup_timeout: int | None = None, base_workers: int | None = None,
                   data_prep: str = "", max_replacements_per_hour: int | None = None,
                   membership_key: str = "",
                   idle_stop_seconds: float | None = None, scheduler: str = "native",
                   munge_key_secret: str = "") -> dict[str, str]:
    """The settings ``DeepLearningCluster`` renders into a group's user data, in its order
    (``mount_point``, ``setup_timeout`` and the master's ``max_replacements_per_hour`` and
    ``idle_stop_seconds`` default to the stack's)."""
    defaults = stack_defaults()
    mount_point = defaults.mount_point if mount_point is None else mount_point
    setup_timeout = defaults.setup_timeout if setup_timeout is None else setup_timeout
    settings = {"role": role, "cluster-id": cluster_id, "stack-name": stack_name or cluster_id,
                "region": region, "master-queue-url": master_queue_url, "efs-id": efs_id,
                "mount-point": mount_point, "wait-handle": wait_handle,
                "setup-timeout": str(setup_timeout)}
    if role == "master" and base_workers is not None:
        settings["base-workers"] = str(base_workers)
    if data_prep:
        settings["data-prep"] = data_prep
    if role == "master":
        from constructs_lib.cluster_settings import ClusterSettings
        from constructs_lib.setting import default_of

        settings["max-replacements-per-hour"] = str(
            default_of(ClusterSettings, "max_replacements_per_hour")
            if max_replacements_per_hour is None else max_replacements_per_hour)
        # idleStopMinutes x 60, as the stack renders it; tests give seconds
        settings["idle-stop-seconds"] = str(
            60 * default_of(ClusterSettings, "idle_stop_minutes")
            if idle_stop_seconds is None else idle_stop_seconds)
    if membership_key:
        settings["membership-key"] = membership_key
    if scheduler != "native":  # Slurm's daemons, authenticated by the munge key
        settings["scheduler"] = scheduler
        settings["munge-key-secret"] = munge_key_secret
    return settings


def install_args(settings: dict[str, str]) -> list[str]:
    """The installer's arguments for ``settings`` (what a node's user data passes)."""
    return [a for key, value in settings.items() for a in (f"--{key}", value)]


def user_data(settings: dict[str, str]) -> str:
    """A user data script ending, as the construct's does, with the installer's line."""
    return ("#!/bin/bash\nset -euo pipefail\ncd /opt/deeplearning/lib\n"
            f"PYTHONPATH=/opt/deeplearning/lib exec python3 -m {INSTALL_MODULE} "
            f"{shlex.join(install_args(settings))}\n")


@dataclass
class ClusterResources:
    """One cluster's groups, queue and templates in moto, and the Lambda's messages about them."""

    endpoint: str
    cluster_id: str
    master_asg: str
    worker_asg: str
    master_queue_url: str
    subnet_id: str
    topic_arn: str
    launch_templates: dict[str, str] = field(default_factory=dict)  # role -> name

    def client(self, service: str):
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION)

    def group_name(self, role: str) -> str:
        return self.master_asg if role == "master" else self.worker_asg

    def group(self, role: str) -> dict:
        return self.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.group_name(role)])["AutoScalingGroups"][0]

    def node_instances(self, role: str) -> list[Instance]:
        """The group's live instances (what ``emulator.nodes.Node`` boots), in group order."""
        states = {i["InstanceId"]: i for i in self.group(role)["Instances"]
                  if i["LifecycleState"] in ("InService", "Pending")}
        if not states:
            return []
        found = {}
        for res in self.client("ec2").describe_instances(InstanceIds=list(states))[
                "Reservations"]:
            for inst in res["Instances"]:
                found[inst["InstanceId"]] = Instance(
                    inst["InstanceId"], inst["PrivateIpAddress"],
                    states[inst["InstanceId"]]["LifecycleState"], inst.get("InstanceType", ""))
        return [found[i] for i in states if i in found]

    def instances(self, role: str) -> list[tuple[str, str]]:
        """(instance id, private address) of the group's live instances, in group order."""
        return [(i.instance_id, i.address) for i in self.node_instances(role)]

    def install_args(self, role: str) -> list[str]:
        """The installer's arguments, read back from the group's launch template."""
        return install_args_from_user_data(group_user_data(self.client("ec2"), self.group(role)),
                                           self.group_name(role))

    # -- the capacity adjuster's messages (docs/protocol.md §3) --------------------------------
    def _snapshot(self, role: str):
        from lambda_src.group_state import snapshot_from_description

        return snapshot_from_description(self.group(role), cluster_id=self.cluster_id,
                                         cluster_tag_key=CLUSTER_TAG_KEY,
                                         role_tag_key=ROLE_TAG_KEY)

    def setup_message(self, role: str, *, status: str = "", reason: str = "") -> dict:
        """The ``asg-setup`` the Lambda sends for the group as it is now; ``status`` and
        ``reason`` replace its decision's (e.g. a failure the group's state cannot show)."""
        from lambda_src import master_messages
        from lambda_src.group_state import decide_launch

        snap = self._snapshot(role)
        decision = decide_launch(snap, launch_error=False, error_text="")
        return master_messages.asg_setup(
            status=status or decision.status or "success", asg=snap.name, role=snap.role,
            cluster_id=self.cluster_id, min_size=snap.min_size, desired=snap.desired,
            max_size=snap.max_size, instances=list(snap.instances),
            reason=reason or decision.reason, cause="")

    def change_message(self, role: str, change: str, instance_id: str) -> dict:
        """The ``membership-change`` the Lambda sends when ``instance_id`` left (``terminate``)
        or failed to (``terminate-error``), or a ``launch`` seen after setup."""
        from lambda_src import master_messages

        snap = self._snapshot(role)
        return master_messages.membership_change(
            change=change, asg=snap.name, role=snap.role, cluster_id=self.cluster_id,
            instance_id=instance_id, desired=snap.desired, instances=list(snap.instances))

    def drain_message(self, instance_id: str, token: str, *, hook: str | None = None) -> dict:
        """The ``drain-request`` the Lambda sends for a worker entering Terminating:Wait
        (``hook``: the stack's drain hook unless given)."""
        from lambda_src import master_messages

        hook = stack_defaults().drain_hook if hook is None else hook
        return master_messages.drain_request(
            asg=self.worker_asg, role="worker", cluster_id=self.cluster_id,
            instance_id=instance_id, lifecycle_hook=hook, lifecycle_action_token=token)

    def send(self, body: dict | str) -> None:
        """Put ``body`` on the master queue (a string as is: malformed messages too)."""
        text = body if isinstance(body, str) else json.dumps(body)
        self.client("sqs").send_message(QueueUrl=self.master_queue_url, MessageBody=text)

    def queue_depth(self) -> int:
        """Messages on the master queue, in flight included."""
        attrs = self.client("sqs").get_queue_attributes(
            QueueUrl=self.master_queue_url,
            AttributeNames=["ApproximateNumberOfMessages",
                            "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]) + int(
            attrs["ApproximateNumberOfMessagesNotVisible"])


def create_cluster(endpoint: str, *, cluster_id: str = "dlc-test", workers: int = 3,
                   min_workers: int | None = None, max_workers: int | None = None,
                   instance_type: str = "p3.2xlarge", mount_point: str | None = None,
                   wait_handle: str = "", data_prep: str = "",
                   scheduler: str = "native") -> ClusterResources:
    """The stack's AWS side for ``workers`` workers (see the module docstring); unset
    ``min_workers`` and ``mount_point`` are the stack's defaults (:func:`stack_defaults`).
    ``instance_type`` is the tests' 1-GPU type (the one ``emulator.imds`` reports), not the
    stack's default. ``scheduler="slurm"``: the cluster's munge key made in Secrets Manager
    as the stack makes it (generated text), its ARN in both groups' user data."""
    import boto3

    defaults = stack_defaults()
    min_workers = defaults.min_workers if min_workers is None else min_workers

    def client(service: str):
        return boto3.client(service, endpoint_url=endpoint, region_name=REGION)

    ec2, asg, sqs, sns = client("ec2"), client("autoscaling"), client("sqs"), client("sns")
    service_quotas.request_operator_increases(client("service-quotas"))  # before the launches
    max_workers = workers if max_workers is None else max_workers
    if not 0 <= min_workers <= workers <= max_workers:
        raise ValueError(f"need 0 <= min_workers <= workers <= max_workers, got {min_workers}, "
                         f"{workers}, {max_workers}")
    vpc = ec2.create_vpc(CidrBlock=vpc_cidr())["Vpc"]["VpcId"]
    public, private = subnets()
    subnet_ids = [ec2.create_subnet(VpcId=vpc, CidrBlock=cidr,
                                    AvailabilityZone=f"{REGION}{az}")["Subnet"]["SubnetId"]
                  for cidr, az in zip(public + private, "abab", strict=True)]
    subnet = subnet_ids[len(public)]
    dead_letters = sqs.create_queue(QueueName=f"{cluster_id}-master-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    queue = sqs.create_queue(QueueName=f"{cluster_id}-master", Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5})})[
        "QueueUrl"]
    topic = sns.create_topic(Name=f"{cluster_id}-notifications")["TopicArn"]
    # the stack's membership key: the master signs the membership, workers verify
    membership_key = client("kms").create_key(
        KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY",
        Description=f"{cluster_id} membership")["KeyMetadata"]["Arn"]
    munge_key_secret = ""
    if scheduler != "native":
        sm = client("secretsmanager")
        key = sm.get_random_password(PasswordLength=1024, ExcludeCharacters=" ")["RandomPassword"]
        munge_key_secret = sm.create_secret(Name=f"{cluster_id}-munge-key",
                                            SecretString=key)["ARN"]
    names: dict[str, str] = {}
    templates: dict[str, str] = {}
    for role, (low, desired, high) in (("master", (1, 1, 1)),
                                       ("worker", (min_workers, workers, max_workers))):
        settings = agent_settings(
            role, cluster_id=cluster_id, master_queue_url=queue, mount_point=mount_point,
            wait_handle=wait_handle if role == "master" else "",
            base_workers=workers if role == "master" else None, data_prep=data_prep,
            membership_key=membership_key, scheduler=scheduler,
            munge_key_secret=munge_key_secret)
        templates[role] = f"{cluster_id}-{role}-template"
        ec2.create_launch_template(LaunchTemplateName=templates[role], LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": instance_type,
            "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2},
            "UserData": base64.b64encode(user_data(settings).encode()).decode()})
        names[role] = f"{cluster_id}-{ROLE_TAGS[role]}Group-{uuid.uuid4().hex[:8]}"
        asg.create_auto_scaling_group(
            AutoScalingGroupName=names[role],
            LaunchTemplate={"LaunchTemplateName": templates[role], "Version": "$Latest"},
            MinSize=low, MaxSize=high, DesiredCapacity=desired, VPCZoneIdentifier=subnet,
            Tags=[{"Key": CLUSTER_TAG_KEY, "Value": cluster_id, "PropagateAtLaunch": True},
                  {"Key": ROLE_TAG_KEY, "Value": ROLE_TAGS[role], "PropagateAtLaunch": True}])
    asg.put_lifecycle_hook(LifecycleHookName=defaults.drain_hook,
                           AutoScalingGroupName=names["worker"],
                           LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
                           HeartbeatTimeout=defaults.drain_heartbeat, DefaultResult="CONTINUE",
                           NotificationTargetARN=topic)
    return ClusterResources(endpoint, cluster_id, names["master"], names["worker"], queue,
                            subnet, topic, templates)


_cluster_numbers = itertools.count()


def loopback_instances(count: int, *, instance_type: str = "c5.xlarge") -> list[Instance]:
    """``count`` running instances, the first for the master group (``127.21.0.x``), the
    others workers (``127.21.128.x``), in the /16 after the emulated VPC's
    (``address_space.loopback_prefix``), where no deployed cluster's node is. Each call in a
    process gets other addresses (and other processes too, by PID), so a node never meets a
    previous cluster's lingering socket."""
    k = next(_cluster_numbers) % 12
    base = 13 * (os.getpid() % 19)
    net = loopback_prefix()
    addresses = [f"{net}.0.{(100 + base + k) % 250 + 2}",
                 *(f"{net}.128.{(base + 8 * k + i) % 250 + 2}" for i in range(count - 1))]
    return [Instance(f"i-{uuid.uuid4().hex[:17]}", address, "InService", instance_type)
            for address in addresses]

"""The emulator's additions to moto (``emulator.moto_extensions``; the lifecycle hooks and Spot
interruptions: ``emulator.lifecycle_hooks``), over moto's HTTP server.

A small template deployed through moto's CloudFormation gives a group with a termination
lifecycle hook and notification configurations, as the stack's worker group has them; the
tests then drive it with the Auto Scaling API the product uses and check what AWS
documents: the wait state, the notifications on the hook's topic, CompleteLifecycleAction,
the heartbeat timeout and a Spot interruption.
"""

from __future__ import annotations

import json
import urllib.request

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator import moto_publishing
from emulator import notifications as nt
from lambda_src import asg_notifications
from tests.conftest import REGION
from tests.support.agents import wait_until
from tests.support.quotas import operator_quotas

TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
ROLE = "arn:aws:iam::123456789012:role/hook-publisher"
NOTIFICATION_TYPES = ["autoscaling:EC2_INSTANCE_LAUNCH", "autoscaling:EC2_INSTANCE_TERMINATE"]


def template(heartbeat: int, default: str) -> dict:
    return {"Resources": {
        "Topic": {"Type": "AWS::SNS::Topic"},
        "Config": {"Type": "AWS::AutoScaling::LaunchConfiguration",
                   "Properties": {"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"}},
        "Group": {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": {
            "AvailabilityZones": [f"{REGION}a"], "LaunchConfigurationName": {"Ref": "Config"},
            "MinSize": "0", "MaxSize": "4", "DesiredCapacity": "2",
            "NotificationConfigurations": [{"TopicARN": {"Ref": "Topic"},
                                            "NotificationTypes": NOTIFICATION_TYPES}]}},
        "Hook": {"Type": "AWS::AutoScaling::LifecycleHook", "Properties": {
            "AutoScalingGroupName": {"Ref": "Group"}, "LifecycleHookName": "drain",
            "LifecycleTransition": TERMINATING, "HeartbeatTimeout": heartbeat,
            "DefaultResult": default, "NotificationTargetARN": {"Ref": "Topic"},
            "RoleARN": ROLE}}}}


class Stack:
    """The deployed template: its group, topic, and what was published to the topic."""

    def __init__(self, endpoint: str, heartbeat: int = 300, default: str = "CONTINUE"):
        operator_quotas(endpoint)  # the group's launches fit the account's vCPU quotas
        self.asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=REGION)
        self.ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION)
        cfn = boto3.client("cloudformation", endpoint_url=endpoint, region_name=REGION)
        cfn.create_stack(StackName="hooks", TemplateBody=json.dumps(template(heartbeat,
                                                                             default)))
        res = {r["LogicalResourceId"]: r["PhysicalResourceId"]
               for r in cfn.describe_stack_resources(StackName="hooks")["StackResources"]}
        self.group, self.topic = res["Group"], res["Topic"]

    def instances(self) -> dict[str, str]:
        """Instance id -> lifecycle state, as DescribeAutoScalingGroups shows them."""
        group = self.asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.group])["AutoScalingGroups"][0]
        return {i["InstanceId"]: i["LifecycleState"] for i in group["Instances"]}

    def ec2_state(self, instance_id: str) -> str:
        res = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return res[0]["Instances"][0]["State"]["Name"]

    def messages(self) -> list[dict]:
        """Every message on the topic, parsed as the Lambda parses them."""
        out = []
        for p in moto_publishing.published():
            assert p["topic_arn"] == self.topic
            out.append(json.loads(p["message"]))
        return out

    def lifecycle(self, instance_id: str) -> dict:
        (msg,) = [m for m in self.messages() if m.get("EC2InstanceId") == instance_id
                  and "LifecycleTransition" in m]
        return msg


@pytest.fixture()
def stack(moto_reset) -> Stack:
    return Stack(moto_reset)


def test_hook_from_the_template_with_its_target_role_and_test_notification(stack):
    (hook,) = stack.asg.describe_lifecycle_hooks(
        AutoScalingGroupName=stack.group)["LifecycleHooks"]
    assert (hook["LifecycleHookName"], hook["LifecycleTransition"], hook["HeartbeatTimeout"],
            hook["DefaultResult"], hook["NotificationTargetARN"], hook["RoleARN"]) == (
        "drain", TERMINATING, 300, "CONTINUE", stack.topic, ROLE)
    (test,) = stack.messages()
    assert test["Event"] == "autoscaling:TEST_NOTIFICATION"
    assert test["AutoScalingGroupName"] == stack.group
    assert set(stack.instances().values()) == {"InService"}


def test_terminate_waits_for_the_hook_then_complete_terminates(stack):
    victim, other = sorted(stack.instances())
    stack.asg.terminate_instance_in_auto_scaling_group(InstanceId=victim,
                                                       ShouldDecrementDesiredCapacity=True)
    assert stack.instances() == {victim: "Terminating:Wait", other: "InService"}
    assert stack.ec2_state(victim) == "running"
    msg = stack.lifecycle(victim)
    # The documented shape, and what the capacity adjuster makes of it.
    assert {k: msg[k] for k in ("Origin", "Destination", "LifecycleHookName",
                                "LifecycleTransition", "AutoScalingGroupName", "Service")} == {
        "Origin": "AutoScalingGroup", "Destination": "EC2", "LifecycleHookName": "drain",
        "LifecycleTransition": TERMINATING, "AutoScalingGroupName": stack.group,
        "Service": "AWS Auto Scaling"}
    (record,) = nt.sns_event(stack.topic, msg)["Records"]
    parsed = asg_notifications.parse_record(record)
    assert parsed.is_lifecycle
    assert parsed.instance_id == victim and parsed.lifecycle_action_token == \
        msg["LifecycleActionToken"]

    stack.asg.complete_lifecycle_action(
        LifecycleHookName="drain", AutoScalingGroupName=stack.group,
        LifecycleActionToken=msg["LifecycleActionToken"], LifecycleActionResult="CONTINUE",
        InstanceId=victim)
    assert stack.instances() == {other: "InService"}
    assert stack.ec2_state(victim) == "terminated"
    terminate = [m for m in stack.messages() if m.get("Event") == NOTIFICATION_TYPES[1]]
    assert [m["EC2InstanceId"] for m in terminate] == [victim]
    group = stack.asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=[stack.group])["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 1

    with pytest.raises(ClientError) as err:  # no action waits any more
        stack.asg.complete_lifecycle_action(
            LifecycleHookName="drain", AutoScalingGroupName=stack.group,
            LifecycleActionToken=msg["LifecycleActionToken"],
            LifecycleActionResult="CONTINUE", InstanceId=victim)
    assert err.value.response["Error"]["Code"] == "ValidationError"
    assert f"No active Lifecycle Action found with instance ID {victim}" in str(err.value)


def test_lower_desired_capacity_spares_protected_instances(stack):
    protected, free = sorted(stack.instances())
    stack.asg.set_instance_protection(InstanceIds=[protected], AutoScalingGroupName=stack.group,
                                      ProtectedFromScaleIn=True)
    stack.asg.set_desired_capacity(AutoScalingGroupName=stack.group, DesiredCapacity=1)
    assert stack.instances() == {protected: "InService", free: "Terminating:Wait"}
    token = stack.lifecycle(free)["LifecycleActionToken"]
    stack.asg.complete_lifecycle_action(  # by token alone, as the API allows
        LifecycleHookName="drain", AutoScalingGroupName=stack.group,
        LifecycleActionToken=token, LifecycleActionResult="ABANDON")
    assert stack.instances() == {protected: "InService"}
    assert stack.ec2_state(free) == "terminated"


def test_force_deleting_the_group_terminates_its_protected_instances_too(stack):
    """ForceDelete terminates every instance; moto alone spares the scale-in protected ones,
    which then run on without a group. (A stack's deletion never force-deletes:
    tests/emulator/test_stack_deletion.py.)"""
    protected, free = sorted(stack.instances())
    stack.asg.set_instance_protection(InstanceIds=[protected], AutoScalingGroupName=stack.group,
                                      ProtectedFromScaleIn=True)
    stack.asg.delete_auto_scaling_group(AutoScalingGroupName=stack.group, ForceDelete=True)
    assert stack.ec2_state(protected) == "terminated"
    assert stack.ec2_state(free) == "terminated"


def test_scale_out_publishes_the_launch(stack):
    before = set(stack.instances())
    stack.asg.set_desired_capacity(AutoScalingGroupName=stack.group, DesiredCapacity=3)
    (new,) = set(stack.instances()) - before
    launches = [m for m in stack.messages() if m.get("Event") == NOTIFICATION_TYPES[0]]
    assert [m["EC2InstanceId"] for m in launches] == [new]


def test_heartbeat_timeout_applies_the_default_result(moto_reset):
    # Long enough that the heartbeat below lands before the timeout on a loaded machine
    # (a 1 s timeout expired between two calls once in CI), short enough to wait out.
    stack = Stack(moto_reset, heartbeat=5, default="ABANDON")
    victim, other = sorted(stack.instances())
    stack.asg.terminate_instance_in_auto_scaling_group(InstanceId=victim,
                                                       ShouldDecrementDesiredCapacity=True)
    token = stack.lifecycle(victim)["LifecycleActionToken"]
    # A heartbeat restarts the timeout: the action is still there to be heartbeaten.
    stack.asg.record_lifecycle_action_heartbeat(
        LifecycleHookName="drain", AutoScalingGroupName=stack.group,
        LifecycleActionToken=token, InstanceId=victim)
    wait_until(lambda: victim not in stack.instances(), 30, what="the timeout's termination")
    assert stack.ec2_state(victim) == "terminated"
    assert stack.instances() == {other: "InService"}
    with pytest.raises(ClientError) as err:
        stack.asg.record_lifecycle_action_heartbeat(
            LifecycleHookName="drain", AutoScalingGroupName=stack.group,
            LifecycleActionToken=token, InstanceId=victim)
    assert err.value.response["Error"]["Code"] == "ValidationError"


def test_spot_interruption_drains_through_the_hook_and_launches_a_replacement(
        stack, emulator_cloud):
    victim, other = sorted(stack.instances())
    req = urllib.request.Request(f"{emulator_cloud.control}/spot-interruption",
                                 data=json.dumps({"instance_id": victim}).encode(),
                                 method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer = json.loads(resp.read())
    assert answer["group"] == stack.group
    states = stack.instances()
    assert states.pop(victim) == "Terminating:Wait" and states.pop(other) == "InService"
    (replacement,) = states  # desired capacity unchanged: a new instance
    assert states[replacement] == "InService"
    assert stack.lifecycle(victim)["LifecycleHookName"] == "drain"


def test_a_template_bucket_is_versioned_and_private_as_the_template_says(moto_reset):
    """moto's CloudFormation applies only a bucket's encryption and tags; the emulator
    applies VersioningConfiguration and PublicAccessBlockConfiguration too (the checkpoint
    bucket keeps every version of a checkpoint, as on AWS)."""
    cfn = boto3.client("cloudformation", endpoint_url=moto_reset, region_name=REGION)
    cfn.create_stack(StackName="buckets", TemplateBody=json.dumps({"Resources": {"B": {
        "Type": "AWS::S3::Bucket", "Properties": {
            "VersioningConfiguration": {"Status": "Enabled"},
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True}}}}}))
    (res,) = cfn.describe_stack_resources(StackName="buckets")["StackResources"]
    s3 = boto3.client("s3", endpoint_url=moto_reset, region_name=REGION)
    name = res["PhysicalResourceId"]
    assert s3.get_bucket_versioning(Bucket=name)["Status"] == "Enabled"
    block = s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
    assert block == {"BlockPublicAcls": True, "IgnorePublicAcls": True,
                     "BlockPublicPolicy": True, "RestrictPublicBuckets": True}
    for body in (b"1", b"2"):
        s3.put_object(Bucket=name, Key="k", Body=body)
    assert len(s3.list_object_versions(Bucket=name)["Versions"]) == 2

"""The emulator's warm pools (``emulator.warm_pool``) over moto's HTTP server: a template like
the stack's worker group (a launch hook without a target, a Stopped pool of 2) fills the
pool, holds each pool instance in ``Warmed:Pending:Wait`` until its hook is completed, then
stops it; a replacement is drawn from the pool (started, not launched) and held in
``Pending:Wait`` until completed again; the pool is topped up; the hook's timeout applies its
default result."""

from __future__ import annotations

import json

import boto3
import pytest

from tests.conftest import REGION
from tests.support.agents import wait_until

LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"


def template(heartbeat: int, pool: int = 2) -> dict:
    return {"Resources": {
        "Config": {"Type": "AWS::AutoScaling::LaunchConfiguration",
                   "Properties": {"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"}},
        "Group": {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": {
            "AvailabilityZones": [f"{REGION}a"], "LaunchConfigurationName": {"Ref": "Config"},
            "MinSize": "0", "MaxSize": "4", "DesiredCapacity": "2"}},
        "Hook": {"Type": "AWS::AutoScaling::LifecycleHook", "Properties": {
            "AutoScalingGroupName": {"Ref": "Group"}, "LifecycleHookName": "warm-launch",
            "LifecycleTransition": LAUNCHING, "HeartbeatTimeout": heartbeat,
            "DefaultResult": "ABANDON"}},
        "Pool": {"Type": "AWS::AutoScaling::WarmPool", "DependsOn": "Hook", "Properties": {
            "AutoScalingGroupName": {"Ref": "Group"}, "MinSize": pool,
            "MaxGroupPreparedCapacity": pool, "PoolState": "Stopped",
            "InstanceReusePolicy": {"ReuseOnScaleIn": False}}}}}


class Group:
    def __init__(self, endpoint: str, heartbeat: int = 300) -> None:
        self.asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=REGION)
        self.ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION)
        cfn = boto3.client("cloudformation", endpoint_url=endpoint, region_name=REGION)
        cfn.create_stack(StackName="warm", TemplateBody=json.dumps(template(heartbeat)))
        res = {r["LogicalResourceId"]: r["PhysicalResourceId"]
               for r in cfn.describe_stack_resources(StackName="warm")["StackResources"]}
        self.name = res["Group"]

    def pool(self) -> dict[str, str]:
        res = self.asg.describe_warm_pool(AutoScalingGroupName=self.name)
        assert res["WarmPoolConfiguration"]["MinSize"] == 2
        return {i["InstanceId"]: i["LifecycleState"] for i in res["Instances"]}

    def members(self) -> dict[str, str]:
        group = self.asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.name])["AutoScalingGroups"][0]
        return {i["InstanceId"]: i["LifecycleState"] for i in group["Instances"]}

    def ec2_state(self, iid: str) -> str:
        res = self.ec2.describe_instances(InstanceIds=[iid])["Reservations"]
        return res[0]["Instances"][0]["State"]["Name"]

    def complete(self, iid: str, result: str = "CONTINUE") -> None:
        self.asg.complete_lifecycle_action(
            LifecycleHookName="warm-launch", AutoScalingGroupName=self.name, InstanceId=iid,
            LifecycleActionResult=result)


@pytest.fixture()
def group(moto_reset) -> Group:
    return Group(moto_reset)


def test_the_pool_fills_warms_and_stops(group: Group) -> None:
    members = group.members()
    assert list(members.values()) == ["InService", "InService"]
    pool = group.pool()
    assert len(pool) == 2 and set(pool.values()) == {"Warmed:Pending:Wait"}
    assert not set(pool) & set(members)
    first, second = sorted(pool)
    assert group.ec2_state(first) == "running"  # its user data runs: it is being prepared
    group.complete(first)
    assert group.pool()[first] == "Warmed:Stopped"
    assert group.ec2_state(first) == "stopped"
    assert group.pool()[second] == "Warmed:Pending:Wait"


def test_a_replacement_is_drawn_from_the_pool_and_the_pool_refilled(group: Group) -> None:
    for iid in group.pool():
        group.complete(iid)
    warmed = set(group.pool())
    before = set(group.members())
    lost = sorted(before)[0]
    group.asg.terminate_instance_in_auto_scaling_group(
        InstanceId=lost, ShouldDecrementDesiredCapacity=False)
    members = group.members()
    assert lost not in members
    (replacement,) = set(members) - before
    assert replacement in warmed  # started from the pool, not launched
    assert members[replacement] == "Pending:Wait"
    assert group.ec2_state(replacement) == "running"
    group.complete(replacement)
    assert group.members()[replacement] == "InService"
    pool = group.pool()
    assert len(pool) == 2 and replacement not in pool
    (fresh,) = set(pool) - warmed
    assert pool[fresh] == "Warmed:Pending:Wait"  # launched to keep MinSize
    assert len(group.members()) == 2


def test_a_cold_launch_with_an_empty_pool_waits_for_its_hook_too(group: Group) -> None:
    """Nothing Warmed:Stopped yet (both still warming): the replacement launches cold."""
    pool_before = set(group.pool())
    before = set(group.members())
    group.asg.terminate_instance_in_auto_scaling_group(
        InstanceId=sorted(before)[0], ShouldDecrementDesiredCapacity=False)
    (cold,) = set(group.members()) - before
    assert cold not in pool_before and group.members()[cold] == "Pending:Wait"
    assert set(group.pool()) == pool_before  # still warming, none drawn
    group.complete(cold)
    assert group.members()[cold] == "InService"


def test_the_hooks_timeout_abandons_a_pool_instance_and_refills(moto_reset) -> None:
    group = Group(moto_reset, heartbeat=1)
    first = set(group.pool())
    wait_until(lambda: first.isdisjoint(group.pool()) and len(group.pool()) == 2, 10,
               what="both unprepared pool instances abandoned and replaced")
    for iid in first:
        assert group.ec2_state(iid) == "terminated"


def test_completing_an_unknown_action_is_refused(group: Group) -> None:
    from botocore.exceptions import ClientError

    member = sorted(group.members())[0]  # launched before the hook existed: nothing waits
    with pytest.raises(ClientError, match="No active Lifecycle Action"):
        group.complete(member)


def test_deleting_the_stack_terminates_the_pool(group: Group, moto_reset) -> None:
    pool = set(group.pool())
    cfn = boto3.client("cloudformation", endpoint_url=moto_reset, region_name=REGION)
    cfn.delete_stack(StackName="warm")
    assert {group.ec2_state(i) for i in pool} == {"terminated"}

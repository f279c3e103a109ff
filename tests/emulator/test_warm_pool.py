"""The emulator's warm pools over moto's HTTP server.

Auto Scaling's side (``emulator.warm_pool``): a template like the stack's worker group (a
launch hook without a target, a Stopped pool of 2) fills the pool, holds each pool instance
in ``Warmed:Pending:Wait`` until its hook is completed, then stops it; a replacement is drawn
from the pool (started, not launched) and held in ``Pending:Wait`` until completed again; the
pool is topped up; the hook's timeout applies its default result.

EC2's side (``emulator.autoscaling`` with fake machines, no processes): pool instances boot
(the boot delay) and are stopped once their launch hook is completed; an unhealthy worker's
replacement is drawn from the pool and STARTED (the start delay, no user data), not booted.
``make bench`` prints the replacement time with and without a pool under a given emulated
boot delay."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator.autoscaling import AutoScaling
from emulator.deploy import Instance
from tests.conftest import REGION
from tests.support.agents import wait_until
from tests.support.quotas import operator_quotas

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
        operator_quotas(endpoint)  # the pool's launches fit the account's vCPU quotas
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


# -- EC2's side: the emulated Auto Scaling with fake machines ------------------------------

HOOK = "warm-launch"


@dataclass
class FakeMachine:
    """What AutoScaling needs of a node; its 'agent' completes the launch hook as
    bootstrap_scripts.agent.warm_pool does (once prepared, and once started InService)."""

    instance: Instance
    role: str
    complete: object
    status: str = "running"
    procs: dict = field(default_factory=dict)  # no processes: no status checks
    groups: list = field(default_factory=list)
    agent_pid: int = 0
    target: str = ""
    boots: int = 0
    starts: int = 0

    @property
    def instance_id(self) -> str:
        return self.instance.instance_id

    @property
    def address(self) -> str:
        return self.instance.address

    def restart_units(self, _now: float) -> list[str]:
        return []

    def forget_kernel_rules(self) -> None:
        pass

    def set_target_lifecycle_state(self, state: str) -> None:
        self.target = state

    def start_again(self, start_delay: float) -> None:
        time.sleep(start_delay)
        self.starts += 1
        self.status = "running"
        self.complete(self.instance_id)


class Harness:
    def __init__(self, endpoint: str, *, pool: bool, boot_delay: float,
                 start_delay: float) -> None:
        operator_quotas(endpoint)  # the group's launches fit the account's vCPU quotas
        self.asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=REGION)
        cfn = boto3.client("cloudformation", endpoint_url=endpoint, region_name=REGION)
        body = template(300)
        if not pool:
            del body["Resources"]["Pool"], body["Resources"]["Hook"]
        cfn.create_stack(StackName="warm", TemplateBody=json.dumps(body))
        self.name = next(r["PhysicalResourceId"] for r in cfn.describe_stack_resources(
            StackName="warm")["StackResources"] if r["LogicalResourceId"] == "Group")
        self.machines: list[FakeMachine] = []
        self.boot_delay = boot_delay
        self.cloud = AutoScaling(boto3.session.Session(region_name=REGION),
                                 {"worker": self.name}, nodes=lambda: list(self.machines),
                                 boot=self.boot, start_delay=start_delay)

    def complete(self, iid: str) -> None:
        try:
            self.asg.complete_lifecycle_action(
                LifecycleHookName=HOOK, AutoScalingGroupName=self.name, InstanceId=iid,
                LifecycleActionResult="CONTINUE")
        except ClientError as exc:
            assert "No active Lifecycle Action" in str(exc)  # no hook, or launched before it

    def boot(self, instance: Instance, role: str) -> FakeMachine:
        time.sleep(self.boot_delay)
        machine = FakeMachine(instance, role, self.complete, boots=1,
                              target="Warmed:Stopped" if instance.state.startswith("Warmed")
                              else "InService")
        self.machines.append(machine)
        self.complete(instance.instance_id)
        return machine

    def members(self) -> dict[str, str]:
        group = self.asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.name])["AutoScalingGroups"][0]
        return {i["InstanceId"]: i["LifecycleState"] for i in group["Instances"]}

    def pool(self) -> dict[str, str]:
        res = self.asg.describe_warm_pool(AutoScalingGroupName=self.name)
        return {i["InstanceId"]: i["LifecycleState"] for i in res["Instances"]}

    def ready(self, pool_size: int) -> bool:
        pool = self.pool()
        stopped = {m.instance_id for m in self.machines if m.status == "stopped"}
        return (len(self.machines) - len(self.gone()) == 2 + pool_size
                and len(pool) == pool_size and set(pool.values()) <= {"Warmed:Stopped"}
                and set(pool) <= stopped and set(self.members().values()) == {"InService"})

    def gone(self) -> list[FakeMachine]:
        return [m for m in self.machines if m.status == "removed"]

    def replace_one(self, timeout: float) -> tuple[str, float]:
        """Mark a member Unhealthy; (its replacement, seconds from Auto Scaling terminating
        it to the replacement's machine running with its launch action completed). Timed
        from the emulated Auto Scaling's own events: the refill of the pool boots in the
        same thread afterwards and must not count."""
        before = set(self.members())
        sick = sorted(before)[0]
        self.asg.set_instance_health(InstanceId=sick, HealthStatus="Unhealthy")

        def replaced():
            members = self.members()
            new = [i for i in set(members) - before if members[i] == "InService"
                   and any(m.instance_id == i and m.status == "running" for m in self.machines)]
            return new[0] if new and sick not in members else None

        replacement = str(self.cloud.run_until(replaced, timeout, "the replacement InService",
                                               tick=0.02))
        (terminated,) = self.cloud.events_of("unhealthy-terminated", sick)
        (up,) = [e for e in self.cloud.events if e.instance_id == replacement
                 and e.what in ("node-booted", "node-started") and e.at > terminated.at]
        return replacement, up.at - terminated.at


def test_a_replacement_is_started_from_the_pool_not_booted(moto_reset, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    h = Harness(moto_reset, pool=True, boot_delay=0.0, start_delay=0.0)
    h.cloud.run_until(lambda: h.ready(2), 20, "the pool prepared and stopped", tick=0.02)
    warmed = set(h.pool())
    pool_machines = [m for m in h.machines if m.instance_id in warmed]
    assert all(m.target == "Warmed:Stopped" and m.status == "stopped" for m in pool_machines)
    assert len(h.cloud.events_of("node-stopped")) == 2

    replacement, _ = h.replace_one(20)
    assert replacement in warmed
    machine = next(m for m in h.machines if m.instance_id == replacement)
    assert (machine.boots, machine.starts, machine.target) == (1, 1, "InService")
    assert [e.instance_id for e in h.cloud.events_of("node-started")] == [replacement]
    # the pool is refilled: a new instance launched into it, booted and stopped
    h.cloud.run_until(lambda: h.ready(2), 20, "the pool refilled", tick=0.02)
    assert replacement not in h.pool() and len(set(h.pool()) - warmed) == 1


@pytest.mark.bench
def test_bench_replacement_with_and_without_a_warm_pool(emulator_cloud, moto_reset, monkeypatch,
                                                       capsys) -> None:
    """Replacement time of an unhealthy worker (Unhealthy -> replacement InService with a
    running machine), EMULATED: the boot and start delays are slept, not real EC2 times."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    boot_delay, start_delay = 2.0, 0.2
    figures = {}
    for pool in (False, True):
        h = Harness(moto_reset, pool=pool, boot_delay=boot_delay, start_delay=start_delay)
        h.cloud.run_until(lambda h=h, pool=pool: h.ready(2 if pool else 0), 60, "ready",
                            tick=0.02)
        _, seconds = h.replace_one(60)
        figures[pool] = seconds
        emulator_cloud.reset()
    with capsys.disabled():
        print(f"\nreplacement of an unhealthy worker, EMULATED time (boot delay {boot_delay} s, "
              f"start delay {start_delay} s, both slept; not EC2 figures): cold boot "
              f"{figures[False]:.2f} s, from the warm pool {figures[True]:.2f} s")


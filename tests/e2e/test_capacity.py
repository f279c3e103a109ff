"""Capacity that does not give up, end to end, and the emulator playing short capacity.

The demo run: no ``g6.xlarge`` anywhere and neither ``g5.xlarge`` (the master's type) nor
``g4dn.xlarge`` in ``us-east-1a``; the cluster has a placement group (one zone, zone
fallback on) and the workers the fallback list ``g6.xlarge,g4dn.xlarge``. Auto Scaling's
launch errors reach the real Lambda, which moves both groups to ``us-east-1b``; there the
workers launch their second type, and the job trains on a moved cluster of mixed types.
Run through ``flock /tmp/e2e.lock`` like every demo (it boots an emulated cluster).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

from bootstrap_scripts.protocol import launches
from bootstrap_scripts.protocol.paths import ClusterPaths
from emulator import capacity
from tests.support.demo import assert_nothing_left, run_demo
from tests.support.quotas import operator_quotas

REGION = "us-east-1"


# -- the emulator plays short capacity as AWS does (fast, in-process moto) ----------------------


@pytest.fixture()
def moto_with_capacity(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto with ``emulator.capacity``'s patches (undone after the test)."""
    from moto.autoscaling.models import FakeAutoScalingGroup

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for name, method in capacity.patches(FakeAutoScalingGroup).items():
        monkeypatch.setattr(FakeAutoScalingGroup, name, method)
    with mock_aws():
        import boto3

        operator_quotas()  # the launches fit the account's vCPU quotas (emulator.vcpu_quotas)
        yield boto3.client("autoscaling", region_name=REGION), boto3.client(
            "ec2", region_name=REGION)
    capacity.reset()


def _group(asg: Any, ec2: Any, name: str, subnets: list[str], types: list[str],
           desired: int) -> None:
    template = ec2.create_launch_template(
        LaunchTemplateName=f"{name}-lt",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": types[0]},
    )["LaunchTemplate"]["LaunchTemplateId"]
    spec = {"LaunchTemplateId": template, "Version": "$Latest"}
    placement: dict[str, Any] = {"LaunchTemplate": spec}
    if len(types) > 1:
        placement = {"MixedInstancesPolicy": {
            "LaunchTemplate": {"LaunchTemplateSpecification": spec,
                               "Overrides": [{"InstanceType": t} for t in types]},
            "InstancesDistribution": {"OnDemandAllocationStrategy": "prioritized"}}}
    asg.create_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, MaxSize=desired,
                                  DesiredCapacity=desired, VPCZoneIdentifier=",".join(subnets),
                                  **placement)


def _instances(asg: Any, ec2: Any, name: str) -> list[tuple[str, str]]:
    """(type, zone) of the group's instances."""
    ids = [i["InstanceId"] for i in asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"]]
    if not ids:
        return []
    res = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return sorted((i["InstanceType"], i["Placement"]["AvailabilityZone"])
                  for r in res for i in r["Instances"])


def _subnets(ec2: Any) -> list[str]:
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    return [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24",
                              AvailabilityZone=f"{REGION}{z}")["Subnet"]["SubnetId"]
            for i, z in enumerate("ab")]


def test_prioritized_fallback_launches_the_next_type(moto_with_capacity: Any) -> None:
    asg, ec2 = moto_with_capacity
    subnets = _subnets(ec2)
    capacity.set_out(["p5.48xlarge"])
    _group(asg, ec2, "w", subnets[:1], ["p5.48xlarge", "p4d.24xlarge"], 2)
    assert _instances(asg, ec2, "w") == [("p4d.24xlarge", f"{REGION}a")] * 2


def test_a_spread_group_finds_the_zone_that_has_capacity(moto_with_capacity: Any) -> None:
    asg, ec2 = moto_with_capacity
    subnets = _subnets(ec2)
    capacity.set_out([f"g5.xlarge@{REGION}a"])
    _group(asg, ec2, "w", subnets, ["g5.xlarge"], 2)
    assert _instances(asg, ec2, "w") == [("g5.xlarge", f"{REGION}b")] * 2


def test_nothing_in_the_zone_fails_and_a_move_refills(moto_with_capacity: Any) -> None:
    asg, ec2 = moto_with_capacity
    subnets = _subnets(ec2)
    capacity.set_out([f"g5.xlarge@{REGION}a", f"g4dn.xlarge@{REGION}a"])
    _group(asg, ec2, "w", subnets[:1], ["g5.xlarge", "g4dn.xlarge"], 2)
    assert _instances(asg, ec2, "w") == []  # no capacity: desired stays, nothing launched
    assert asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=["w"])["AutoScalingGroups"][0]["DesiredCapacity"] == 2
    asg.update_auto_scaling_group(AutoScalingGroupName="w", VPCZoneIdentifier=subnets[1])
    assert _instances(asg, ec2, "w") == [("g5.xlarge", f"{REGION}b")] * 2
    policy = asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=["w"])["AutoScalingGroups"][0]["MixedInstancesPolicy"]
    assert len(policy["LaunchTemplate"]["Overrides"]) == 2  # kept, as AWS keeps it


def test_flaky_launches_fail_then_the_groups_retry_fills(moto_with_capacity: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault hook fails the first N launches of the tagged group only; the group's
    retry (Auto Scaling keeps launching toward desired) then fills it. The retry delay is
    set far out so a ticker thread left in this process by another test cannot retry
    early; the test steps its own clock past it."""
    asg, ec2 = moto_with_capacity
    subnets = _subnets(ec2)
    monkeypatch.setattr(capacity, "RETRY_SECONDS", 1e6)
    later = time.monotonic() + 2e6
    capacity.set_flaky(2, "NodeType=Worker")
    _group(asg, ec2, "other", subnets[:1], ["g5.xlarge"], 1)  # untagged: not affected
    _group(asg, ec2, "w", subnets[:1], ["g5.xlarge"], 3)
    asg.create_or_update_tags(Tags=[{"ResourceId": "w", "ResourceType": "auto-scaling-group",
                                     "Key": "NodeType", "Value": "Worker",
                                     "PropagateAtLaunch": True}])
    asg.set_desired_capacity(AutoScalingGroupName="w", DesiredCapacity=4)  # tagged now
    assert len(_instances(asg, ec2, "other")) == 1
    assert len(_instances(asg, ec2, "w")) == 3  # one more wanted, failed for capacity
    assert capacity.flaky_state() == {"left": 1, "failed": 1}
    capacity.tick(later)  # the retry: the second flaky launch fails too
    assert len(_instances(asg, ec2, "w")) == 3
    capacity.tick(later)  # capacity freed: the retry launches it
    assert len(_instances(asg, ec2, "w")) == 4
    assert capacity.flaky_state() == {"left": 0, "failed": 2}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        capacity.set_flaky(1, "Worker")


def test_a_group_without_capacity_keeps_retrying(moto_with_capacity: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    asg, ec2 = moto_with_capacity
    subnets = _subnets(ec2)
    monkeypatch.setattr(capacity, "RETRY_SECONDS", 1e6)
    later = time.monotonic() + 2e6
    capacity.set_out(["g5.xlarge"])
    _group(asg, ec2, "w", subnets, ["g5.xlarge"], 2)
    capacity.tick(later)
    assert _instances(asg, ec2, "w") == []  # still none: the retries keep failing
    capacity.set_out([])  # capacity frees
    capacity.tick(later)
    assert len(_instances(asg, ec2, "w")) == 2


def test_launch_error_text_is_ec2s() -> None:
    text = capacity.ice_message("p5.48xlarge", "us-east-1a", ["us-east-1b"], mixed=True)
    assert text.startswith("Could not launch On-Demand Instances. InsufficientInstanceCapacity"
                           " - We currently do not have sufficient p5.48xlarge capacity in the "
                           "Availability Zone you requested (us-east-1a).")
    assert text.endswith("or choosing us-east-1b. Launching EC2 instance failed.")
    with pytest.raises(ValueError, match="TYPE or TYPE@ZONE"):
        capacity.parse_spec("p5@nowhere")


# -- the demo ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_moves_a_placement_group_cluster_and_trains_on_mixed_types(tmp_path: Path) -> None:
    code, out, report = run_demo(
        tmp_path, "--workers", "2", "--epochs", "4", "--require-acc", "0.8",
        "--capacity-out", "g6.xlarge", "--capacity-out", f"g5.xlarge@{REGION}a",
        "--capacity-out", f"g4dn.xlarge@{REGION}a",
        "--context", "placementGroup=true",
        "--context", "workerInstanceTypes=g6.xlarge,g4dn.xlarge")
    assert code == 0, out
    assert report["status"] == "succeeded"
    cap = report["capacity"]
    # the cluster formed at full size in the next zone, the workers on their second type
    assert sorted((n["role"], n["instance_type"], n["zone"]) for n in cap["nodes"]) == [
        ("master", "g5.xlarge", f"{REGION}b"), ("worker", "g4dn.xlarge", f"{REGION}b"),
        ("worker", "g4dn.xlarge", f"{REGION}b")]
    assert report["world_size"] == 3 and report["final_acc"] >= 0.8
    # the console says what the fallback chose, node by node
    for n in cap["nodes"]:
        line = f"runs on {n['instance_type']} in {n['zone']}"
        assert any(n["instance_id"] in ln and line in ln for ln in out.splitlines()), line
    assert sum("(fallback: g6.xlarge had no capacity)" in ln for ln in out.splitlines()) == 2
    # the Lambda's decisions, each with EC2's cause
    moves = [d for d in cap["decisions"] if d["msg"] == "zone-decision"
             and d["action"] == "move"]
    assert len(moves) == 1
    assert "InsufficientInstanceCapacity" in moves[0]["cause"] or \
        "do not have sufficient" in moves[0]["cause"]
    moved = {d["moved_asg"] for d in cap["decisions"] if d["msg"] == "group-moved"}
    assert moved == {report["stack"]["groups"]["master"]["name"],
                     report["stack"]["groups"]["worker"]["name"]}
    assert not [d for d in cap["decisions"] if d["msg"] == "capacity-lowered"]
    # what failed is on EFS, zone by zone
    recorded = launches.launch_failures(ClusterPaths(tmp_path / "work" / "efs"))
    assert {(a.zone, a.decision) for a in recorded} == {(f"{REGION}a", "move")}
    assert json.dumps(cap["launch_failures"])
    # the membership carries each node's type
    membership = json.loads((Path(report["nodes"][0]["root"]) /
                             "opt/deeplearning/membership.json").read_text())
    assert sorted(n["instance_type"] for n in membership["nodes"]) == [
        "g4dn.xlarge", "g4dn.xlarge", "g5.xlarge"]
    assert_nothing_left(tmp_path, report)

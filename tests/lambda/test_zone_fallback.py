"""Zone fallback: the pure decision as a table, and the handler moving a single-zone cluster's
groups in moto (in-process), with what was tried reaching the master's failure reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from adjuster_harness import (
    LAUNCH,
    LAUNCH_ERROR,
    REGION,
    Cloud,
    backend_group,
    drop_instances,
    fixture_record,
    import_adjuster,
    lambda_environment,
    sns_event,
)
from moto import mock_aws

from bootstrap_scripts.protocol import launches
from bootstrap_scripts.protocol.messages import AsgSetup, parse_message
from bootstrap_scripts.protocol.paths import ClusterPaths
from lambda_src import zone_fallback as zf

adjuster = import_adjuster()
WORKERS = "DLClusterStack-WorkerGroupASG-AAAA"
MASTER = "DLClusterStack-MasterGroupASG-BBBB"
#: EC2's insufficient-capacity text as Auto Scaling puts it in a launch error, plain and
#: as a mixed instances group words it (the launch goes through EC2 Fleet there).
ICE_A = ("We currently do not have sufficient p5.48xlarge capacity in the Availability Zone "
         "you requested (us-east-1a). Our system will be working on provisioning additional "
         "capacity. You can currently get p5.48xlarge capacity by not specifying an "
         "Availability Zone in your request or choosing us-east-1b, us-east-1c. Launching EC2 "
         "instance failed.")
ICE_MIXED = ("Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently "
             "do not have sufficient p4d.24xlarge capacity in the Availability Zone you "
             "requested (us-east-1b). Our system will be working on provisioning additional "
             "capacity. Launching EC2 instance failed.")
VCPU_LIMIT = ("You have requested more vCPU capacity than your current vCPU limit of 32 allows "
              "for the instance bucket that the specified instance type belongs to. Please "
              "visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to "
              "this limit. Launching EC2 instance failed.")
CHOICES = (zf.ZoneChoice("us-east-1a", "subnet-a", "pg-a"),
           zf.ZoneChoice("us-east-1b", "subnet-b", "pg-b"),
           zf.ZoneChoice("us-east-1c", "subnet-c", "pg-c"))


# -- the decision, as a table ---------------------------------------------------------------


@pytest.mark.parametrize(("case", "kwargs", "action", "target", "words"), [
    ("plain launch", dict(launch_error=False), zf.STAY, None, "not a launch error"),
    ("one zone", dict(choices=CHOICES[:1]), zf.STAY, None, "fallback is off"),
    ("no moves allowed", dict(max_moves=0), zf.STAY, None, "fallback is off"),
    ("vCPU limit", dict(status_message=VCPU_LIMIT), zf.STAY, None, "another reason"),
    ("spread group", dict(subnets=("subnet-a", "subnet-b")), zf.STAY, None, "not one of"),
    ("first failure", {}, zf.MOVE, "us-east-1b", "moving the master and worker groups"),
    ("mixed group text", dict(status_message=ICE_MIXED, failed_zone="us-east-1b",
                              subnets=("subnet-b",)), zf.MOVE, "us-east-1c", "move 2 of"),
    ("late duplicate", dict(subnets=("subnet-b",)), zf.STALE, None, "already left"),
    ("formed", dict(cluster_formed=True), zf.STAY, None, "has formed"),
    ("moves used up", dict(max_moves=1, subnets=("subnet-b",), failed_zone="us-east-1b"),
     zf.STAY, None, "the most allowed"),
    ("last zone", dict(max_moves=5, subnets=("subnet-c",), failed_zone="us-east-1c"),
     zf.STAY, None, "no zone left"),
    ("no zone in the notification", dict(failed_zone=""), zf.MOVE, "us-east-1b", "moving"),
])
def test_decide_zone_move(case: str, kwargs: dict, action: str, target: str | None,
                          words: str) -> None:
    args: dict[str, Any] = dict(launch_error=True, status_message=ICE_A,
                                failed_zone="us-east-1a", subnets=("subnet-a",),
                                choices=CHOICES, max_moves=2, cluster_formed=False)
    move = zf.decide_zone_move(**{**args, **kwargs})
    assert move.action == action, case
    assert (move.target.zone if move.target else None) == target, case
    assert words in move.reason, (case, move.reason)


@pytest.mark.parametrize(("text", "capacity", "itype"), [
    (ICE_A, True, "p5.48xlarge"),
    (ICE_MIXED, True, "p4d.24xlarge"),
    (VCPU_LIMIT, False, ""),
    ("There is no Spot capacity available that matches your request.", False, ""),
    ("", False, ""),
])
def test_capacity_texts(text: str, capacity: bool, itype: str) -> None:
    assert zf.is_capacity_error(text) is capacity
    assert zf.failed_type(text) == itype


def test_parse_choices_and_attempts() -> None:
    assert zf.parse_choices("us-east-1a|subnet-a|pg-a,us-east-1b|subnet-b|,bad") == (
        zf.ZoneChoice("us-east-1a", "subnet-a", "pg-a"), zf.ZoneChoice("us-east-1b", "subnet-b"))
    tried = zf.attempts(subnets=("subnet-c",), choices=CHOICES, types=("p5.48xlarge",),
                        failed_zone="us-east-1c", status_message=ICE_A, decision="")
    assert [(a["zone"], a["decision"]) for a in tried] == [
        ("us-east-1a", "move"), ("us-east-1b", "move"), ("us-east-1c", "")]
    assert tried[-1]["cause"] == ICE_A


# -- the handler against moto -----------------------------------------------------------------


@pytest.fixture()
def zones(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cloud, str, list[str]]]:
    """A VPC with one subnet in each of three zones; the function's zone order a, b, c."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        c = Cloud()
        queue_url = c.queue()
        vpc = c.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnets = [c.ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24",
                                       AvailabilityZone=f"{REGION}{z}")["Subnet"]["SubnetId"]
                   for i, z in enumerate("abc")]
        choices = ",".join(f"{REGION}{z}|{s}|pg-{z}" for z, s in zip("abc", subnets,
                                                                     strict=True))
        lambda_environment(monkeypatch, queue_url, ZONE_CHOICES=choices, MAX_ZONE_MOVES="2")
        yield c, queue_url, subnets


def make_group(c: Cloud, name: str, role: str, desired: int, subnet: str) -> list[str]:
    c.group(name, min_size=1 if role == "Master" else 0, desired=desired, max_size=desired,
            role=role)
    c.asg.update_auto_scaling_group(AutoScalingGroupName=name, VPCZoneIdentifier=subnet)
    return c.instance_ids(name)


def launch_error(group: str, zone: str, text: str = ICE_A) -> dict[str, Any]:
    record = fixture_record(LAUNCH_ERROR, group)
    message = json.loads(record["Sns"]["Message"])
    message["StatusMessage"] = text
    message["Details"] = {"Subnet ID": "subnet-x", "Availability Zone": zone}
    record["Sns"]["Message"] = json.dumps(message)
    return record


def subnets_of(c: Cloud, name: str) -> str:
    return c.describe(name)["VPCZoneIdentifier"]


def fill(name: str) -> None:
    """Auto Scaling brings a group back to desired by itself; moto acts only on a call."""
    group = backend_group(name)
    group.set_desired_capacity(group.desired_capacity)


def test_capacity_error_moves_both_groups_then_launches_report_the_attempts(
        zones: tuple[Cloud, str, list[str]]) -> None:
    c, queue_url, subnets = zones
    master = make_group(c, MASTER, "Master", 1, subnets[0])
    make_group(c, WORKERS, "Worker", 2, subnets[0])
    drop_instances(WORKERS, 2)  # no capacity in zone a for the workers

    out = adjuster.handler(sns_event(launch_error(WORKERS, f"{REGION}a")), None)
    assert out["outcomes"] == ["zone-move"]
    assert subnets_of(c, WORKERS) == subnets_of(c, MASTER) == subnets[1]
    assert c.desired(WORKERS) == 2  # nothing lowered
    assert master[0] not in c.instance_ids(MASTER)  # the master is replaced in zone b
    assert c.messages(queue_url) == []  # the new zone's launches will report

    # the second failure of zone a arrives late: nothing moves again, nothing is lowered
    out = adjuster.handler(sns_event(launch_error(WORKERS, f"{REGION}a")), None)
    assert out["outcomes"] == ["zone-stale"]
    assert subnets_of(c, WORKERS) == subnets[1] and c.desired(WORKERS) == 2

    fill(WORKERS)
    workers = c.instance_ids(WORKERS)
    assert len(workers) == 2
    out = adjuster.handler(sns_event(fixture_record(LAUNCH, WORKERS, workers[-1])), None)
    assert out["outcomes"] == ["asg-setup-success"]
    (body,) = c.messages(queue_url)
    assert body["decision"] == "report"
    assert [(a["zone"], a["decision"]) for a in body["attempts"]] == [(f"{REGION}a", "move")]


def test_moves_are_bounded_then_the_count_is_lowered(
        zones: tuple[Cloud, str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    c, queue_url, subnets = zones
    monkeypatch.setenv("MAX_ZONE_MOVES", "1")
    make_group(c, MASTER, "Master", 1, subnets[1])
    make_group(c, WORKERS, "Worker", 3, subnets[1])  # already moved once (a -> b)
    drop_instances(WORKERS, 1)
    out = adjuster.handler(sns_event(launch_error(WORKERS, f"{REGION}b", ICE_MIXED)), None)
    assert out["outcomes"] == ["asg-setup-success"]
    assert subnets_of(c, WORKERS) == subnets[1]
    assert c.desired(WORKERS) == 2
    (body,) = c.messages(queue_url)
    assert body["decision"] == "lower"
    assert [(a["zone"], a["decision"]) for a in body["attempts"]] == [
        (f"{REGION}a", "move"), (f"{REGION}b", "")]
    assert body["attempts"][-1]["cause"] == ICE_MIXED


def test_formed_cluster_stays_in_its_zone(zones: tuple[Cloud, str, list[str]]) -> None:
    c, _queue_url, subnets = zones
    master = make_group(c, MASTER, "Master", 1, subnets[0])
    make_group(c, WORKERS, "Worker", 3, subnets[0])
    c.asg.set_instance_protection(AutoScalingGroupName=MASTER, InstanceIds=master,
                                  ProtectedFromScaleIn=True)  # what the master does at formation
    drop_instances(WORKERS, 1)
    out = adjuster.handler(sns_event(launch_error(WORKERS, f"{REGION}a")), None)
    assert out["outcomes"] == ["asg-setup-success"]
    assert subnets_of(c, WORKERS) == subnets[0] and c.instance_ids(MASTER) == master
    assert c.desired(WORKERS) == 2


def test_other_errors_lower_at_once(zones: tuple[Cloud, str, list[str]]) -> None:
    c, _queue_url, subnets = zones
    make_group(c, MASTER, "Master", 1, subnets[0])
    make_group(c, WORKERS, "Worker", 3, subnets[0])
    drop_instances(WORKERS, 1)
    out = adjuster.handler(sns_event(launch_error(WORKERS, f"{REGION}a", VCPU_LIMIT)), None)
    assert out["outcomes"] == ["asg-setup-success"]
    assert subnets_of(c, WORKERS) == subnets[0] and c.desired(WORKERS) == 2


def test_failure_reason_and_record_name_every_zone_and_type(
        zones: tuple[Cloud, str, list[str]], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    c, queue_url, subnets = zones
    monkeypatch.setenv("MAX_ZONE_MOVES", "1")
    make_group(c, MASTER, "Master", 1, subnets[1])
    c.group(WORKERS, min_size=2, desired=2, max_size=2, role="Worker")
    c.asg.update_auto_scaling_group(AutoScalingGroupName=WORKERS, VPCZoneIdentifier=subnets[1])
    drop_instances(WORKERS, 2)
    adjuster.handler(sns_event(launch_error(WORKERS, f"{REGION}b", ICE_MIXED)), None)
    (body,) = c.messages(queue_url)
    assert body["status"] == "failure"
    msg = parse_message(json.dumps(body))
    assert isinstance(msg, AsgSetup)
    reason = launches.setup_failure_reason(msg)
    assert reason.startswith(f"worker group {WORKERS}: cannot reach its minimum")
    assert f"zone {REGION}a: insufficient capacity (moved to the next zone)" in reason
    assert f"zone {REGION}b, p4d.24xlarge: Could not launch On-Demand" in reason

    paths = ClusterPaths(tmp_path)
    assert launches.record_attempts(paths, msg, now=1.0) == 2
    assert launches.record_attempts(paths, msg, now=2.0) == 0  # a duplicate adds nothing
    recorded = launches.launch_failures(paths)
    assert [(a.zone, a.decision, a.at) for a in recorded] == [
        (f"{REGION}a", "move", 1.0), (f"{REGION}b", "", 1.0)]
    assert launches.describe(recorded[-1]).startswith(f"zone {REGION}b, p4d.24xlarge: ")

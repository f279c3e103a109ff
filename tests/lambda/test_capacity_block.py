"""A Capacity Block's end (``lambda_src/capacity_block.py``): the deploy-time check as a
table, ``Custom::CapacityBlockEnd`` answered against the emulator's EC2 (a bought block, a
missing id refused as EC2 refuses it), and the scheduled release through the capacity
adjuster's entry point: protection lifted, the group at 0 (drained like a scale-in)."""

from __future__ import annotations

import datetime as dt

import boto3
import pytest

from emulator import capacity_blocks
from lambda_src import capacity_adjuster, capacity_block, custom_resources
from tests.conftest import REGION
from tests.support.quotas import operator_quotas

ACCOUNT = "123456789012"
STACK = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/DLClusterStack/1"
NOW = dt.datetime(2026, 6, 1, 8, 0, tzinfo=dt.UTC)
END = dt.datetime(2026, 6, 3, 11, 30, tzinfo=dt.UTC)  # blocks end at 11:30 UTC
BLOCK = "cr-0123456789abcdef0"


def block(**over: object) -> dict:
    return {"CapacityReservationId": BLOCK, "ReservationType": "capacity-block",
            "State": "active", "EndDate": END, **over}


def test_the_times_are_the_lead_before_the_end_and_the_master_ten_minutes_later() -> None:
    assert capacity_block.check(BLOCK, block(), 60, NOW) == {
        "EndDate": "2026-06-03T11:30:00", "TerminationsBeginAt": "2026-06-03T11:00:00",
        "WorkersStopAt": "2026-06-03T10:30:00", "MasterStopAt": "2026-06-03T10:40:00"}
    # the least lead still has the master gone 5 minutes before EC2's terminations
    least = capacity_block.check(BLOCK, block(), 45, NOW)
    assert least["MasterStopAt"] < least["TerminationsBeginAt"]


@pytest.mark.parametrize(("found", "words"), [
    (None, [BLOCK, "does not exist", "describe-capacity-reservations"]),
    (block(ReservationType="default"), [BLOCK, "not a Capacity Block",
                                        "capacityReservationId"]),
    (block(State="expired"), [BLOCK, "'expired'", "runs no instance"]),
    (block(State="payment-failed"), [BLOCK, "'payment-failed'"]),
    (block(EndDate=None), [BLOCK, "no EndDate"]),
    (block(EndDate=NOW + dt.timedelta(minutes=80)),
     [BLOCK, "ends at 2026-06-01 09:20 UTC", "leave at 2026-06-01 08:20 UTC", "20 min from now",
      "capacityBlockLeadMinutes"]),
])
def test_a_block_that_cannot_carry_the_cluster_is_refused_naming_it(found, words) -> None:
    with pytest.raises(capacity_block.BlockRefused) as err:
        capacity_block.check(BLOCK, found, 60, NOW)
    for word in words:
        assert word in str(err.value)


def request(block_id: str, kind: str = "Create", lead: str = "60") -> dict:
    return {"RequestType": kind, "ResponseURL": "unused", "StackId": STACK, "RequestId": "r",
            "LogicalResourceId": "CapacityBlockEnd",
            "ResourceType": capacity_block.RESOURCE_TYPE,
            "ResourceProperties": {"CapacityBlockId": block_id, "LeadMinutes": lead}}


class Clients:
    def __init__(self, endpoint: str) -> None:
        self.ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION)
        self.autoscaling = boto3.client("autoscaling", endpoint_url=endpoint,
                                        region_name=REGION)


def test_the_deploy_reads_a_bought_blocks_end_and_refuses_a_missing_one(moto_reset) -> None:
    clients = Clients(moto_reset)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    bought = capacity_blocks.purchase_block(
        ACCOUNT, REGION, instance_type="p5.48xlarge", count=2, zone=f"{REGION}a",
        start=now - dt.timedelta(hours=1), end=now + dt.timedelta(days=1))
    answer = custom_resources.respond(request(bought), clients)
    assert answer["Status"] == "SUCCESS", answer
    assert answer["PhysicalResourceId"] == bought
    end = now + dt.timedelta(days=1)
    assert answer["Data"]["WorkersStopAt"] == (end - dt.timedelta(minutes=60)).strftime(
        capacity_block.AT_FORMAT)
    assert answer["Data"]["MasterStopAt"] == (end - dt.timedelta(minutes=50)).strftime(
        capacity_block.AT_FORMAT)
    assert custom_resources.respond(request(bought, "Update", "90"), clients)["Data"][
        "WorkersStopAt"] == (end - dt.timedelta(minutes=90)).strftime(capacity_block.AT_FORMAT)
    missing = custom_resources.respond(request(BLOCK), clients)
    assert missing["Status"] == "FAILED"
    assert f"Capacity Block {BLOCK} does not exist" in missing["Reason"]
    assert custom_resources.respond(request(BLOCK, "Delete"), clients)["Status"] == "SUCCESS"


def test_a_block_that_ended_is_expired_and_refused(moto_reset) -> None:
    now = dt.datetime.now(dt.UTC)
    gone = capacity_blocks.purchase_block(
        ACCOUNT, REGION, instance_type="p5.48xlarge", count=1, zone=f"{REGION}a",
        start=now - dt.timedelta(days=2), end=now - dt.timedelta(days=1))
    answer = custom_resources.respond(request(gone), Clients(moto_reset))
    assert answer["Status"] == "FAILED" and "'expired'" in answer["Reason"]


def test_the_schedules_invocation_lifts_protection_and_takes_the_group_to_zero(
        moto_reset, monkeypatch) -> None:
    operator_quotas(moto_reset)
    asg = Clients(moto_reset).autoscaling
    asg.create_launch_configuration(LaunchConfigurationName="lc", ImageId="ami-12c6146b",
                                    InstanceType="t3.micro")
    asg.create_auto_scaling_group(AutoScalingGroupName="workers", LaunchConfigurationName="lc",
                                  MinSize=2, MaxSize=4, DesiredCapacity=2,
                                  AvailabilityZones=[f"{REGION}a"])
    ids = [i["InstanceId"] for i in asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=["workers"])["AutoScalingGroups"][0]["Instances"]]
    asg.set_instance_protection(AutoScalingGroupName="workers", InstanceIds=ids,
                                ProtectedFromScaleIn=True)  # the master agent's base workers
    for name, value in (("AWS_ENDPOINT_URL", moto_reset), ("AWS_DEFAULT_REGION", REGION),
                        ("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    event = capacity_block.scheduled_input(BLOCK, "workers")  # the schedule's fixed input
    done = capacity_adjuster.handler(event, None)
    assert sorted(done["unprotected"]) == sorted(ids) and done["group"] == "workers"
    (group,) = asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=["workers"])["AutoScalingGroups"]
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 0, 0)
    assert not [i for i in group["Instances"] if i.get("ProtectedFromScaleIn")]
    with pytest.raises(ValueError, match="must name a group"):
        capacity_block.release_at_end({"CapacityBlockEnd": {"Group": ""}}, asg)

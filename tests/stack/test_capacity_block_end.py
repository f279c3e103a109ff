"""A Capacity Block's end in the template: ``Custom::CapacityBlockEnd`` before both groups,
two one-time schedules fed from its attributes that invoke the capacity adjuster for the
workers' group, then the master's, a schedules' role that may invoke only that function,
and the ``capacityBlockLeadMinutes`` setting's bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from constructs_lib.validation import ConfigError
from stacks.settings import settings_from_context
from tests.stack.checkov_skips import checkov_binary, failed_checks
from tests.stack.synth import cluster_template

BLOCK = "cr-0123456789abcdef0"
P5 = {"capacityBlockId": BLOCK, "availabilityZones": "us-east-1a,us-east-1b",
      "workerInstanceType": "p5.48xlarge", "masterInstanceType": "p5.48xlarge"}


def _depends(resource: dict) -> set[str]:
    depends = resource.get("DependsOn") or []
    return {depends} if isinstance(depends, str) else set(depends)


def _of_type(resources: dict, kind: str) -> dict[str, dict]:
    return {k: v for k, v in resources.items() if v["Type"] == kind}


@pytest.fixture(scope="module")
def resources() -> dict:
    return cluster_template(**P5, capacityBlockLeadMinutes="90").to_json()["Resources"]


def test_both_groups_wait_for_the_blocks_end_to_be_read(resources: dict) -> None:
    ((end_id, end),) = _of_type(resources, "Custom::CapacityBlockEnd").items()
    assert end["Properties"]["CapacityBlockId"] == BLOCK
    assert end["Properties"]["LeadMinutes"] == "90"
    groups = _of_type(resources, "AWS::AutoScaling::AutoScalingGroup")
    assert len(groups) == 2 and all(end_id in _depends(g) for g in groups.values())
    (adjuster,) = [k for k, v in _of_type(resources, "AWS::Lambda::Function").items()
                   if v["Properties"].get("Handler") == "capacity_adjuster.handler"]
    assert end["Properties"]["ServiceToken"] == {"Fn::GetAtt": [adjuster, "Arn"]}
    (read,) = [s for v in _of_type(resources, "AWS::IAM::Policy").values()
               for s in v["Properties"]["PolicyDocument"]["Statement"]
               if s.get("Sid") == "ReadTheCapacityBlocksEndDate"]
    assert (read["Action"], read["Resource"]) == ("ec2:DescribeCapacityReservations", "*")
    assert not _of_type(resources, "Custom::QuotaCheck")


def test_the_workers_then_the_master_are_released_at_the_times_the_deploy_read(
        resources: dict) -> None:
    (end_id,) = _of_type(resources, "Custom::CapacityBlockEnd")
    (adjuster,) = [k for k, v in _of_type(resources, "AWS::Lambda::Function").items()
                   if v["Properties"].get("Handler") == "capacity_adjuster.handler"]
    group_of = set(_of_type(resources, "AWS::AutoScaling::AutoScalingGroup"))
    schedules = _of_type(resources, "AWS::Scheduler::Schedule")
    seen = {}
    for schedule in schedules.values():
        p = schedule["Properties"]
        attribute = p["ScheduleExpression"]["Fn::Join"][1][1]["Fn::GetAtt"]
        assert attribute[0] == end_id
        assert p["ScheduleExpressionTimezone"] == "UTC"
        assert p["FlexibleTimeWindow"] == {"Mode": "OFF"}
        assert p["Target"]["Arn"] == {"Fn::GetAtt": [adjuster, "Arn"]}
        head, group, tail = p["Target"]["Input"]["Fn::Join"][1]
        assert head == ('{"CapacityBlockEnd":{"CapacityBlockId":"' + BLOCK + '","Group":"')
        assert tail == '"}}' and group["Ref"] in group_of
        seen[attribute[1]] = group["Ref"]
    assert set(seen) == {"WorkersStopAt", "MasterStopAt"}
    assert "WorkerGroup" in seen["WorkersStopAt"] and "MasterGroup" in seen["MasterStopAt"]


def test_the_schedules_role_invokes_that_function_only_for_this_account(
        resources: dict) -> None:
    roles = {p["Properties"]["Target"]["RoleArn"]["Fn::GetAtt"][0]
             for p in _of_type(resources, "AWS::Scheduler::Schedule").values()}
    (role_id,) = roles
    (trust,) = resources[role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {
        "Ref": "AWS::AccountId"}}}
    statements = [s for v in _of_type(resources, "AWS::IAM::Policy").values()
                  if {"Ref": role_id} in v["Properties"]["Roles"]
                  for s in v["Properties"]["PolicyDocument"]["Statement"]]
    (adjuster,) = [k for k, v in _of_type(resources, "AWS::Lambda::Function").items()
                   if v["Properties"].get("Handler") == "capacity_adjuster.handler"]
    assert [(s["Action"], s["Resource"]) for s in statements] == [
        ("lambda:InvokeFunction", {"Fn::GetAtt": [adjuster, "Arn"]})]


def test_no_schedule_without_a_block() -> None:
    resources = cluster_template().to_json()["Resources"]
    assert not _of_type(resources, "Custom::CapacityBlockEnd")
    assert not _of_type(resources, "AWS::Scheduler::Schedule")


@pytest.mark.parametrize(("ctx", "words"), [
    ({**P5, "capacityBlockLeadMinutes": "44"}, ["capacityBlockLeadMinutes", ">= 45", "44"]),
    ({**P5, "capacityBlockLeadMinutes": "1441"}, ["capacityBlockLeadMinutes", "at most 1440"]),
    ({"capacityBlockLeadMinutes": "90"}, ["'capacityBlockLeadMinutes' (90)",
                                          "needs 'capacityBlockId'"]),
])
def test_the_lead_is_bounded_and_needs_a_block(ctx: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        settings_from_context(ctx.get)
    for word in words:
        assert word in str(err.value)


@pytest.mark.skipif(checkov_binary() is None, reason="checkov is not installed: make "
                    "checkov-setup (its own venv, .venv-checkov)")
def test_checkov_finds_nothing_in_the_blocks_resources(resources: dict, tmp_path: Path) -> None:
    ours = {k for k in resources if "CapacityBlockEnd" in k}
    assert len(ours) >= 5  # the check, the role, its policy, two schedules
    found = [(check, resource) for check, resource in failed_checks(
        {"Resources": resources}, tmp_path) if resource.split(".", 1)[-1] in ours]
    assert not found, found

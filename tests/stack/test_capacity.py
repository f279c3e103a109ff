"""Capacity that does not give up, in the template: instance-type fallback lists (prioritized
mixed instances policy), multi-zone groups, single-zone groups with their zone-move order,
Capacity Reservations and Capacity Blocks (docs/capacity.md)."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from constructs_lib import DeepLearningCluster
from constructs_lib.validation import ConfigError
from stacks.settings import CAPACITY_CONTEXT_KEYS, settings_from_context
from tests.stack.synth import cluster_template, new_app

RESERVATION = "cr-0123456789abcdef0"
GROUP_ARN = "arn:aws:resource-groups:us-east-1:123456789012:group/my-reservations"


def groups(t: Template) -> dict[str, dict]:
    """Role (from the NodeType tag) -> the group's properties."""
    out = {}
    for res in t.find_resources("AWS::AutoScaling::AutoScalingGroup").values():
        props = res["Properties"]
        role = next(tag["Value"] for tag in props["Tags"] if tag["Key"] == "NodeType")
        out[role.lower()] = props
    return out


def templates(t: Template) -> list[dict]:
    return [r["Properties"]["LaunchTemplateData"]
            for r in t.find_resources("AWS::EC2::LaunchTemplate").values()]


def adjuster_env(t: Template) -> dict:
    fn = next(r for r in t.find_resources("AWS::Lambda::Function").values()
              if r["Properties"].get("Handler") == "capacity_adjuster.handler")
    return fn["Properties"]["Environment"]["Variables"]


def policy_statements(t: Template) -> list[dict]:
    return [s for r in t.find_resources("AWS::IAM::Policy").values()
            for s in r["Properties"]["PolicyDocument"]["Statement"]]


# -- instance-type fallback ----------------------------------------------------------------


def test_default_is_one_type_and_no_mixed_policy() -> None:
    g = groups(cluster_template())
    for props in g.values():
        assert "MixedInstancesPolicy" not in props
        assert "LaunchTemplate" in props


def test_worker_type_list_is_a_prioritized_mixed_instances_policy() -> None:
    t = cluster_template(workerInstanceTypes="p5.48xlarge,p4d.24xlarge")
    g = groups(t)
    policy = g["worker"]["MixedInstancesPolicy"]
    assert [o["InstanceType"] for o in policy["LaunchTemplate"]["Overrides"]] == [
        "p5.48xlarge", "p4d.24xlarge"]
    dist = policy["InstancesDistribution"]
    assert dist["OnDemandAllocationStrategy"] == "prioritized"
    assert dist["OnDemandPercentageAboveBaseCapacity"] == 100
    assert "MixedInstancesPolicy" not in g["master"]  # the master keeps its single type
    # the worker launch template's own type is the preferred one
    assert "p5.48xlarge" in [d.get("InstanceType") for d in templates(t)]


def test_master_type_list_too() -> None:
    g = groups(cluster_template(masterInstanceTypes="g6e.xlarge,g6.xlarge,g5.xlarge"))
    overrides = g["master"]["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]
    assert [o["InstanceType"] for o in overrides] == ["g6e.xlarge", "g6.xlarge", "g5.xlarge"]


def test_type_list_with_spot_keeps_spot_distribution() -> None:
    g = groups(cluster_template(workerInstanceTypes="g6.xlarge,g5.xlarge", spotWorkers="2"))
    dist = g["worker"]["MixedInstancesPolicy"]["InstancesDistribution"]
    assert dist["SpotAllocationStrategy"] == "price-capacity-optimized"
    assert dist["OnDemandPercentageAboveBaseCapacity"] == 0
    assert g["worker"]["CapacityRebalance"] is True


@pytest.mark.parametrize(("ctx", "words"), [
    ({"workerInstanceType": "g5.xlarge", "workerInstanceTypes": "g6.xlarge"},
     ["'workerInstanceType'", "'workerInstanceTypes'", "g6.xlarge"]),
    ({"masterInstanceType": "g5.xlarge", "masterInstanceTypes": "g6.xlarge"},
     ["'masterInstanceType'", "'masterInstanceTypes'"]),
    ({"workerInstanceTypes": "g6.xlarge,,g5.xlarge"}, ["'workerInstanceTypes'", "''"]),
    ({"workerInstanceTypes": "g6.xlarge,g6.xlarge"}, ["'workerInstanceTypes'", "more than once"]),
    ({"workerInstanceTypes": "g6.xlarge,P5"}, ["'workerInstanceTypes'", "'P5'"]),
])
def test_type_list_errors_name_key_and_value(ctx: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        settings_from_context(ctx.get)
    for word in words:
        assert word in str(err.value)


def test_construct_refuses_both_props() -> None:
    stack = cdk.Stack(new_app(), "S")
    with pytest.raises(ConfigError, match="worker_instance_type or worker_instance_types"):
        DeepLearningCluster(stack, "C", worker_instance_type="g5.xlarge",
                            worker_instance_types=["g6.xlarge"])


# -- zones ------------------------------------------------------------------------------------


def test_without_placement_group_groups_span_every_zone() -> None:
    t = cluster_template(placementGroup="false")
    for props in groups(t).values():
        assert len(props["VPCZoneIdentifier"]) == 2
    assert adjuster_env(t)["MAX_ZONE_MOVES"] == "0"
    # no zone moves: no UpdateAutoScalingGroup that may change subnets (the idle stop's
    # may change sizes only)
    assert not [s for s in policy_statements(t)
                if "autoscaling:UpdateAutoScalingGroup" in json.dumps(s["Action"])
                and s.get("Condition", {}).get("Null", {}).get(
                    "autoscaling:VPCZoneIdentifiers") != "true"]


def test_placement_group_is_one_zone_with_a_group_per_zone_and_a_move_order() -> None:
    t = cluster_template(placementGroup="true")
    g = groups(t)
    assert g["master"]["VPCZoneIdentifier"] == g["worker"]["VPCZoneIdentifier"]
    assert len(g["worker"]["VPCZoneIdentifier"]) == 1
    pgs = t.find_resources("AWS::EC2::PlacementGroup")
    assert len(pgs) == 2 and all(p["Properties"]["Strategy"] == "cluster" for p in pgs.values())
    # on the groups (where a move can change it), not in the launch templates
    assert g["worker"]["PlacementGroup"] == g["master"]["PlacementGroup"]
    assert all("Placement" not in d for d in templates(t))
    env = adjuster_env(t)
    assert env["MAX_ZONE_MOVES"] == "1"  # two zones: one move at most, whatever the setting
    assert "ZONE_CHOICES" in json.dumps(env)
    moves = [s for s in policy_statements(t) if s.get("Sid") == "MoveOnlyThisClustersGroups"]
    assert len(moves) == 1
    assert moves[0]["Action"] == "autoscaling:UpdateAutoScalingGroup"
    cond = moves[0]["Condition"]
    assert cond["StringEquals"] == {"autoscaling:ResourceTag/dl-cluster:id": "DLClusterStack"}
    assert len(cond["ForAllValues:StringEquals"]["autoscaling:VPCZoneIdentifiers"]) == 2


def test_three_zones_and_max_zone_moves() -> None:
    t = cluster_template(placementGroup="true", maxZoneMoves="1",
                         availabilityZones="us-east-1c,us-east-1a,us-east-1b")
    env = adjuster_env(t)
    assert env["MAX_ZONE_MOVES"] == "1"
    choices = json.dumps(env["ZONE_CHOICES"])
    assert choices.index("us-east-1c") < choices.index("us-east-1a") < choices.index(
        "us-east-1b")
    assert len(t.find_resources("AWS::EC2::PlacementGroup")) == 3
    subnets = t.find_resources("AWS::EC2::Subnet")
    assert {s["Properties"]["AvailabilityZone"] for s in subnets.values()} == {
        "us-east-1a", "us-east-1b", "us-east-1c"}


def test_zero_moves_turns_zone_fallback_off() -> None:
    t = cluster_template(placementGroup="true", maxZoneMoves="0")
    assert adjuster_env(t)["MAX_ZONE_MOVES"] == "0"


def test_bad_zone_names_fail() -> None:
    with pytest.raises(ConfigError, match=r"'availabilityZones'.*us-east-1"):
        settings_from_context({"availabilityZones": "us-east-1"}.get)


# -- reservations and capacity blocks --------------------------------------------------------


def test_capacity_reservation_targets_it_from_both_launch_templates() -> None:
    t = cluster_template(capacityReservationId=RESERVATION,
                         availabilityZones="us-east-1b,us-east-1a")
    for data in templates(t):
        assert data["CapacityReservationSpecification"] == {
            "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}}
        assert "InstanceMarketOptions" not in data
    g = groups(t)
    assert len(g["worker"]["VPCZoneIdentifier"]) == 1  # the reservation's zone only
    assert adjuster_env(t)["MAX_ZONE_MOVES"] == "0"  # the zone follows the reservation


def test_reservation_group() -> None:
    t = cluster_template(capacityReservationGroupArn=GROUP_ARN,
                         availabilityZones="us-east-1a,us-east-1b")
    for data in templates(t):
        assert data["CapacityReservationSpecification"]["CapacityReservationTarget"] == {
            "CapacityReservationResourceGroupArn": GROUP_ARN}


def test_capacity_block_is_its_own_market() -> None:
    t = cluster_template(capacityBlockId=RESERVATION, availabilityZones="us-east-1a,us-east-1b",
                         workerInstanceType="p5.48xlarge", masterInstanceType="p5.48xlarge")
    for data in templates(t):
        assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
        assert data["CapacityReservationSpecification"] == {
            "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}}
    t.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", Match.object_like(
        {"VPCZoneIdentifier": Match.any_value()}))


@pytest.mark.parametrize(("ctx", "words"), [
    ({"capacityReservationId": "cr-123"}, ["'capacityReservationId'", "'cr-123'", "17 hex"]),
    ({"capacityBlockId": "cr-0123456789ABCDEF0"}, ["'capacityBlockId'", "cr-0123456789ABCDEF0"]),
    ({"capacityReservationGroupArn": "arn:aws:ec2:us-east-1:1:group/x"},
     ["'capacityReservationGroupArn'", "resource group ARN"]),
    ({"capacityReservationId": RESERVATION, "capacityBlockId": RESERVATION},
     ["'capacityReservationId'", "'capacityBlockId'"]),
])
def test_reservation_errors_name_key_and_value(ctx: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        settings_from_context(ctx.get)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(("ctx", "words"), [
    ({"capacityReservationId": RESERVATION},
     ["capacity_reservation_id needs availability_zones", "describe-capacity-reservations"]),
    ({"capacityBlockId": RESERVATION, "availabilityZones": "us-east-1a,us-east-1b",
      "workerInstanceTypes": "p5.48xlarge,p4d.24xlarge"},
     ["capacity_block_id", "worker_instance_types", "p4d.24xlarge"]),
    ({"capacityBlockId": RESERVATION, "availabilityZones": "us-east-1a,us-east-1b",
      "spotWorkers": "1"}, ["capacity_block_id", "spot_workers"]),
    # One reservation (or block) is one instance type: the master cannot be another type.
    ({"capacityReservationId": RESERVATION, "availabilityZones": "us-east-1a,us-east-1b",
      "workerInstanceType": "p5.48xlarge"},
     [f"capacity_reservation_id='{RESERVATION}'", "master_instance_type g5.xlarge",
      "worker_instance_type p5.48xlarge"]),
    ({"capacityBlockId": RESERVATION, "availabilityZones": "us-east-1a,us-east-1b",
      "workerInstanceType": "p5.48xlarge", "masterInstanceType": "p4d.24xlarge"},
     [f"capacity_block_id='{RESERVATION}'", "p4d.24xlarge", "p5.48xlarge"]),
    # Reserved On-Demand capacity is not for Spot instances, a group's neither.
    ({"capacityReservationId": RESERVATION, "availabilityZones": "us-east-1a,us-east-1b",
      "spotWorkers": "2"}, [f"capacity_reservation_id='{RESERVATION}'", "On-Demand",
                            "spot_workers must be 0, got 2"]),
    ({"capacityReservationGroupArn": GROUP_ARN, "availabilityZones": "us-east-1a,us-east-1b",
      "spotWorkers": "1"}, ["capacity_reservation_group_arn", GROUP_ARN,
                            "spot_workers must be 0, got 1"]),
    # The stack's new placement group cannot hold a reservation made before the deploy.
    ({"capacityReservationId": RESERVATION, "availabilityZones": "us-east-1a,us-east-1b",
      "placementGroup": "true"}, [f"capacity_reservation_id='{RESERVATION}'",
                                  "create_placement_group=True", "created in"]),
])
def test_reservation_combinations_fail_at_synth(ctx: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        cluster_template(**ctx)
    for word in words:
        assert word in str(err.value)


def test_a_reservation_group_may_hold_several_types() -> None:
    """A group holds reservations of several types: master and workers may differ."""
    t = cluster_template(capacityReservationGroupArn=GROUP_ARN,
                         availabilityZones="us-east-1a,us-east-1b",
                         workerInstanceType="p5.48xlarge", masterInstanceType="g5.xlarge")
    assert len(templates(t)) == 2


def test_every_capacity_key_is_parsed() -> None:
    ctx = {"workerInstanceTypes": "p5.48xlarge,p4d.24xlarge",
           "masterInstanceTypes": "g6e.xlarge,g5.xlarge",
           "capacityReservationGroupArn": GROUP_ARN,
           "availabilityZones": "us-east-1b,us-east-1a", "maxZoneMoves": "3"}
    s = settings_from_context(ctx.get)
    assert (s.worker_instance_types, s.master_instance_types, s.capacity_reservation_group_arn,
            s.availability_zones, s.max_zone_moves) == (
        ("p5.48xlarge", "p4d.24xlarge"), ("g6e.xlarge", "g5.xlarge"), GROUP_ARN,
        ("us-east-1b", "us-east-1a"), 3)
    s = settings_from_context({"capacityReservationId": RESERVATION,
                               "capacityBlockId": None}.get)
    assert s.capacity_reservation_id == RESERVATION
    assert set(CAPACITY_CONTEXT_KEYS) >= set(ctx) | {"capacityReservationId", "capacityBlockId"}


# -- cfn-lint and the IAM linter over the capacity variants -------------------------------------

VARIANTS = {
    "zones-types": {"placementGroup": "true", "workerInstanceTypes": "p5.48xlarge,p4d.24xlarge",
                    "masterInstanceTypes": "p5.48xlarge,p4d.24xlarge",
                    "availabilityZones": "us-east-1a,us-east-1b,us-east-1c"},
    "capacity-block": {"capacityBlockId": RESERVATION, "placementGroup": "true",
                       "availabilityZones": "us-east-1b,us-east-1a",
                       "workerInstanceType": "p5.48xlarge", "masterInstanceType": "p5.48xlarge"},
    "reservation-group": {"capacityReservationGroupArn": GROUP_ARN,
                          "availabilityZones": "us-east-1a,us-east-1b"},
    "efa-p5": {"efa": "true", "placementGroup": "true", "workerInstanceType": "p5.48xlarge",
               "masterInstanceType": "p5.48xlarge"},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_pass_cfn_lint_and_the_iam_linter(variant: str, tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    import app as app_module
    from tests.stack.iam_lint import unexplained

    app = app_module.build_app(new_app(outdir=str(tmp_path), **VARIANTS[variant]))
    app.synth()  # cdk-nag: raises on an unacknowledged finding
    template = tmp_path / "DLClusterStack.template.json"
    proc = subprocess.run([str(Path(sys.executable).parent / "cfn-lint"), "--ignore-checks",
                           "W3005", "--", str(template)], capture_output=True, text=True)
    assert not [line for line in proc.stdout.splitlines() if line[:1] == "E"], proc.stdout
    doc = json.loads(template.read_text())
    left, _used = unexplained(doc)
    assert not left, left


# -- launch failures: the retry window and the master's own failure -----------------------------


def test_adjuster_waits_for_retries_and_can_fail_the_setup_itself() -> None:
    """The function gets the retry window (default 600 s) and the wait-condition handle, so a
    master that cannot launch fails the setup at once instead of after 55 minutes."""
    t = cluster_template()
    env = adjuster_env(t)
    assert env["LAUNCH_RETRY_SECONDS"] == "600"
    [handle] = t.find_resources("AWS::CloudFormation::WaitConditionHandle")
    assert env["WAIT_HANDLE_URL"] == {"Ref": handle}


def test_launch_retry_seconds_prop() -> None:
    from aws_cdk import aws_sqs as sqs

    from constructs_lib.capacity_adjuster import CapacityAdjuster

    app = cdk.App()
    stack = cdk.Stack(app, "S")
    queue = sqs.Queue(stack, "Q")
    CapacityAdjuster(stack, "Fast", cluster_id="c", master_queue=queue, launch_retry_seconds=0)
    fn = next(r for r in Template.from_stack(stack).find_resources(
        "AWS::Lambda::Function").values() if r["Properties"].get("Handler") ==
        "capacity_adjuster.handler")
    assert fn["Properties"]["Environment"]["Variables"]["LAUNCH_RETRY_SECONDS"] == "0"
    for i, bad in enumerate((-1, 3300, 1.5, True)):
        with pytest.raises(ConfigError, match=rf"CapacityAdjuster Bad{i}: launch_retry_seconds"):
            CapacityAdjuster(stack, f"Bad{i}", cluster_id="c", master_queue=queue,
                             launch_retry_seconds=bad)  # type: ignore[arg-type]

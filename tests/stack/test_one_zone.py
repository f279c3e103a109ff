"""One zone by default, and the NAT gateway in that zone (issue 45, items 7 and 8).

Training traffic between zones is billed per GB in each direction and slower, so a cluster
starts in one zone, in a cluster placement group, moving whole when that zone has no
capacity (docs/capacity.md, "Zones"); ``placementGroup=false`` spreads it. A NAT gateway lives
in one zone: the default one is in the nodes' first zone, ``natGateways`` gives more, one per
zone. Each test here failed on the code before the change (two zones, no ``natGateways``).
"""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template

from constructs_lib.validation import ConfigError
from stacks.settings import settings_from_context
from tests.stack.synth import cluster_template

RESERVATION = "cr-0123456789abcdef0"
GROUP_ARN = "arn:aws:resource-groups:us-east-1:123456789012:group/my-reservations"


def _resources(t: Template, kind: str) -> dict[str, dict]:
    return {k: r for k, r in t.to_json()["Resources"].items() if r["Type"] == kind}


def node_subnets(t: Template) -> list[list[str]]:
    """Each Auto Scaling group's subnets, by logical id."""
    return [[s["Ref"] for s in g["Properties"]["VPCZoneIdentifier"]]
            for g in _resources(t, "AWS::AutoScaling::AutoScalingGroup").values()]


def zone_of(t: Template, subnet: str) -> str:
    """A subnet's zone as the template says it (a name, or ``Fn::GetAZs`` index)."""
    return json.dumps(t.to_json()["Resources"][subnet]["Properties"]["AvailabilityZone"],
                      sort_keys=True)


def nat_subnets(t: Template) -> list[str]:
    return [n["Properties"]["SubnetId"]["Ref"]
            for n in _resources(t, "AWS::EC2::NatGateway").values()]


def nat_of_private_subnet(t: Template) -> dict[str, str]:
    """Private subnet -> the subnet of the NAT gateway its default route goes to."""
    res = t.to_json()["Resources"]
    nat_subnet = {k: r["Properties"]["SubnetId"]["Ref"] for k, r in res.items()
                  if r["Type"] == "AWS::EC2::NatGateway"}
    table_of = {r["Properties"]["RouteTableId"]["Ref"]: r["Properties"]["SubnetId"]["Ref"]
                for r in res.values()
                if r["Type"] == "AWS::EC2::SubnetRouteTableAssociation"}
    out = {}
    for r in res.values():
        props = r["Properties"] if r["Type"] == "AWS::EC2::Route" else {}
        if props.get("DestinationCidrBlock") == "0.0.0.0/0" and "NatGatewayId" in props:
            out[table_of[props["RouteTableId"]["Ref"]]] = nat_subnet[props["NatGatewayId"]["Ref"]]
    return out


# -- item 7: one zone by default --------------------------------------------------------------


def test_the_default_cluster_is_one_zone_in_a_placement_group_per_zone_it_may_move_to() -> None:
    t = cluster_template()
    master, worker = node_subnets(t)
    assert master == worker and len(worker) == 1
    pgs = _resources(t, "AWS::EC2::PlacementGroup")
    assert len(pgs) == 2 and {p["Properties"]["Strategy"] for p in pgs.values()} == {"cluster"}
    fn = next(r for r in _resources(t, "AWS::Lambda::Function").values()
              if r["Properties"].get("Handler") == "capacity_adjuster.handler")
    env = fn["Properties"]["Environment"]["Variables"]
    assert env["MAX_ZONE_MOVES"] == "1"  # the second zone, with its own group
    assert "ZONE_CHOICES" in env


def test_the_groups_outlive_the_egress_of_every_zone_they_may_move_to() -> None:
    """After a zone move the groups are in the second zone's subnet: CloudFormation must
    delete them before that subnet's default route, or the drains of a moved cluster's
    teardown lose their AWS calls (checked failing with placementGroup=true before)."""
    t = cluster_template()
    routes = {k for k, r in _resources(t, "AWS::EC2::Route").items()
              if "NatGatewayId" in r["Properties"]}
    assert len(routes) == 2
    for g in _resources(t, "AWS::AutoScaling::AutoScalingGroup").values():
        assert routes <= set(g["DependsOn"])


def test_spreading_over_the_zones_is_placement_group_false() -> None:
    t = cluster_template(placementGroup="false")
    master, worker = node_subnets(t)
    assert master == worker and len(worker) == 2
    assert not _resources(t, "AWS::EC2::PlacementGroup")


@pytest.mark.parametrize("ctx", [
    {"capacityReservationId": RESERVATION, "availabilityZones": "us-east-1b,us-east-1a"},
    {"capacityReservationGroupArn": GROUP_ARN, "availabilityZones": "us-east-1b,us-east-1a"},
    {"capacityBlockId": RESERVATION, "availabilityZones": "us-east-1b,us-east-1a",
     "workerInstanceType": "p5.48xlarge", "masterInstanceType": "p5.48xlarge"},
])
def test_a_reservation_or_block_keeps_its_zone_without_a_new_placement_group(ctx) -> None:
    """Unset, ``placementGroup`` is false with a reservation: the reservation fixes the zone,
    and a group made by the deploy holds none of its capacity (explicit ``true`` with
    ``capacityReservationId`` is still refused: tests/stack/test_capacity.py)."""
    assert settings_from_context(ctx.get).placement_group is None
    t = cluster_template(**ctx)
    master, worker = node_subnets(t)
    assert master == worker and len(worker) == 1
    assert zone_of(t, worker[0]) == '"us-east-1b"'
    assert not _resources(t, "AWS::EC2::PlacementGroup")


@pytest.mark.parametrize("kind", ["t3.large", "t4g.medium", "mac2.metal", "m7i-flex.large"])
def test_a_type_ec2_keeps_out_of_cluster_placement_groups_is_refused_at_synth(kind) -> None:
    with pytest.raises(ConfigError) as err:
        cluster_template(masterInstanceType=kind)
    assert kind in str(err.value) and "placementGroup=false" in str(err.value)
    master, _worker = node_subnets(cluster_template(masterInstanceType=kind,
                                                    placementGroup="false"))
    assert len(master) == 2


def test_gpu_types_go_into_the_placement_group() -> None:
    for kind in ("g5.xlarge", "g6e.12xlarge", "p4d.24xlarge", "p5.48xlarge"):
        t = cluster_template(workerInstanceType=kind, masterInstanceType=kind)
        assert len(_resources(t, "AWS::EC2::PlacementGroup")) == 2, kind


# -- item 8: the NAT gateway in the cluster's zone, one per zone on request --------------------


def test_the_one_nat_gateway_is_in_the_nodes_zone() -> None:
    t = cluster_template()
    (nat,) = nat_subnets(t)
    (node_subnet,) = node_subnets(t)[0]
    assert zone_of(t, nat) == zone_of(t, node_subnet)
    assert nat_of_private_subnet(t)[node_subnet] == nat


def test_the_nat_gateway_follows_the_first_of_availability_zones() -> None:
    t = cluster_template(availabilityZones="us-east-1c,us-east-1a,us-east-1b")
    (nat,) = nat_subnets(t)
    (node_subnet,) = node_subnets(t)[0]
    assert zone_of(t, nat) == zone_of(t, node_subnet) == '"us-east-1c"'


def test_nat_gateways_two_gives_each_zone_its_own() -> None:
    """After a zone move the nodes reach AWS through their new zone's own NAT, not across."""
    t = cluster_template(natGateways="2")
    nats = nat_subnets(t)
    assert len(nats) == 2 and len({zone_of(t, n) for n in nats}) == 2
    routes = nat_of_private_subnet(t)
    assert len(routes) == 2
    for private, nat in routes.items():
        assert zone_of(t, private) == zone_of(t, nat)


@pytest.mark.parametrize(("ctx", "words"), [
    ({"natGateways": "3"}, ["'natGateways'", "at most the VPC's zones (2", "got 3"]),
    ({"natGateways": "4", "availabilityZones": "us-east-1a,us-east-1b,us-east-1c"},
     ["(3: availabilityZones=us-east-1a,us-east-1b,us-east-1c)", "got 4"]),
    ({"natGateways": "0"}, ["'natGateways'", ">= 1"]),
    ({"natGateways": "1", "vpcId": "vpc-0123456789abcdef0",
      "vpcPrivateSubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
      "availabilityZones": "us-east-1a,us-east-1b"}, ["'natGateways'", "'vpcId'"]),
])
def test_nat_gateways_beyond_the_zones_or_with_an_existing_vpc_are_refused(ctx, words) -> None:
    with pytest.raises(ConfigError) as err:
        settings_from_context(ctx.get)
    for word in words:
        assert word in str(err.value)


def test_three_zones_three_nat_gateways() -> None:
    t = cluster_template(natGateways="3", availabilityZones="us-east-1a,us-east-1b,us-east-1c")
    assert len({zone_of(t, n) for n in nat_subnets(t)}) == 3

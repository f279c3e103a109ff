"""Where and on what the cluster's nodes launch: instance-type fallback lists, zones, and
Capacity Reservations / Capacity Blocks for ML (docs/capacity.md).

Pure planning and checking, kept out of ``cluster.py``: :func:`check_capacity` validates the
capacity props together (errors name the props and values), :func:`zone_plan` picks the
subnets of each group, and :func:`reserve` writes the reservation into a launch template.

AWS pages this follows:

- mixed instances groups and the ``prioritized`` On-Demand allocation strategy (the first
  type that has capacity launches, in the order given):
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-mixed-instances-groups.html,
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/allocation-strategies.html
- launching into a Capacity Reservation or a reservation group from a launch template
  (``CapacityReservationSpecification.CapacityReservationTarget``), and into a Capacity
  Block (``InstanceMarketOptions.MarketType = capacity-block`` plus the block's id as the
  target): https://docs.aws.amazon.com/autoscaling/ec2/userguide/target-capacity-reservations.html,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html
- a cluster placement group lives in one zone, and takes current-generation types except
  burstable (T), Mac and M7i-flex ones:
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html, its rules
  ("Cluster placement group rules and limitations"):
  https://docs.amazonaws.cn/en_us/AWSEC2/latest/UserGuide/limitations-placement-groups.html
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import aws_ec2 as ec2

from constructs_lib import validation
from lambda_src import capacity_block

#: Zone moves the capacity adjuster may make before it lowers the worker count (single-zone
#: clusters only: with a placement group or EFA).
DEFAULT_MAX_ZONE_MOVES = 2
#: Minutes before a Capacity Block's end at which the workers leave, drained
#: (``constructs_lib/capacity_block_end.py``): 30 minutes before EC2 begins terminating the
#: block's instances (its end minus 30), which covers the drains (at most 5 minutes: the
#: hook's heartbeat), the master's leaving 10 minutes after the workers, a checkpoint's
#: mirror to S3 and EventBridge Scheduler's delivery, with room to spare.
DEFAULT_CAPACITY_BLOCK_LEAD_MINUTES = 60
#: The least lead: the master then leaves 5 minutes before EC2's terminations begin.
MIN_CAPACITY_BLOCK_LEAD_MINUTES = (capacity_block.TERMINATION_LEAD_MINUTES
                                   + capacity_block.MASTER_AFTER_WORKERS_MINUTES + 5)
#: The most lead: a day (Capacity Blocks last one day at the least).
MAX_CAPACITY_BLOCK_LEAD_MINUTES = 24 * 60


@dataclass(frozen=True)
class Capacity:
    """The capacity props of a cluster, checked together."""

    worker_types: tuple[str, ...]
    master_types: tuple[str, ...]
    reservation_id: str | None = None
    reservation_group_arn: str | None = None
    capacity_block_id: str | None = None
    max_zone_moves: int = DEFAULT_MAX_ZONE_MOVES
    #: with a Capacity Block: minutes before its end at which the workers leave
    capacity_block_lead_minutes: int = DEFAULT_CAPACITY_BLOCK_LEAD_MINUTES

    @property
    def reserved(self) -> bool:
        """Launches target a reservation or a block: the zone is the reservation's."""
        return bool(self.reservation_prop)

    @property
    def reservation_prop(self) -> str:
        """The prop that names the reservation ("" without one), for messages."""
        for prop, value in (("capacity_reservation_id", self.reservation_id),
                            ("capacity_reservation_group_arn", self.reservation_group_arn),
                            ("capacity_block_id", self.capacity_block_id)):
            if value:
                return prop
        return ""


def types_prop(single_name: str, single: object, list_name: str, many: object,
               default: str) -> tuple[str, ...]:
    """The ordered types from either the single-type prop or the list prop, not both."""
    if many is not None and single is not None:
        raise validation.ConfigError(
            f"give {single_name} or {list_name}, not both (got {single!r} and {many!r}); "
            f"{list_name} is the ordered fallback list, its first type preferred")
    if many is not None:
        return validation.instance_types(list_name, many)
    return (validation.instance_type(single_name, default if single is None else single),)


def check_capacity(*, worker_types: tuple[str, ...], master_types: tuple[str, ...],
                   reservation_id: str | None, reservation_group_arn: str | None,
                   capacity_block_id: str | None, max_zone_moves: object,
                   spot_workers: int, new_placement_group: bool = False,
                   capacity_block_lead_minutes: object = DEFAULT_CAPACITY_BLOCK_LEAD_MINUTES,
                   ) -> Capacity:
    """Validate the capacity props as a whole; :class:`Capacity` or ConfigError.

    The combinations refused, each because EC2 would refuse the launches (README "When
    capacity is short"): more than one reservation kind; a type list with any reservation
    (it launches its one type); master and workers of different types in one reservation or
    Capacity Block (an instance launches into a reservation only with its instance type);
    Spot workers with any reservation or block (they hold On-Demand capacity, or are their
    own market); a new cluster placement group with a Capacity Reservation (a reservation
    serves a cluster placement group only when it was created in it, and the stack's group
    does not exist yet)."""
    given = {name: value for name, value in (
        ("capacity_reservation_id", reservation_id),
        ("capacity_reservation_group_arn", reservation_group_arn),
        ("capacity_block_id", capacity_block_id)) if value is not None}
    if len(given) > 1:
        raise validation.ConfigError(
            f"give one of {', '.join(given)}, not {len(given)} (got "
            + ", ".join(f"{k}={v!r}" for k, v in given.items()) + ")")
    if reservation_id is not None:
        validation.capacity_reservation_id("capacity_reservation_id", reservation_id)
    if capacity_block_id is not None:
        validation.capacity_reservation_id("capacity_block_id", capacity_block_id)
    if reservation_group_arn is not None:
        validation.resource_group_arn("capacity_reservation_group_arn", reservation_group_arn)
    if given:
        name = next(iter(given))
        for prop, types in (("worker_instance_types", worker_types),
                            ("master_instance_types", master_types)):
            if len(types) > 1:
                raise validation.ConfigError(
                    f"{name} launches one instance type (the reservation's); {prop} lists "
                    f"{len(types)}: {', '.join(types)}")
        if spot_workers:
            why = ("runs every node in the Capacity Block, its own market"
                   if capacity_block_id is not None else
                   "holds On-Demand capacity, which Spot instances do not use")
            raise validation.ConfigError(
                f"{name}={given[name]!r} {why}; spot_workers must be 0, got {spot_workers}")
        if name != "capacity_reservation_group_arn" and worker_types[0] != master_types[0]:
            raise validation.ConfigError(
                f"{name}={given[name]!r} is capacity of one instance type, and an instance "
                f"launches into it only with that type; master_instance_type "
                f"{master_types[0]} differs from worker_instance_type {worker_types[0]} "
                f"(give both the reservation's type)")
        if name == "capacity_reservation_id" and new_placement_group:
            raise validation.ConfigError(
                f"capacity_reservation_id={given[name]!r} with create_placement_group=True: "
                f"a reservation serves a cluster placement group only when it was created in "
                f"that group, and the cluster's new group does not exist before the deploy; "
                f"create the reservation in a placement group and pass placement_group, or "
                f"leave create_placement_group off")
    moves = validation.positive_int("max_zone_moves", max_zone_moves, minimum=0)
    lead = validation.count("capacity_block_lead_minutes", capacity_block_lead_minutes,
                            minimum=MIN_CAPACITY_BLOCK_LEAD_MINUTES,
                            maximum=MAX_CAPACITY_BLOCK_LEAD_MINUTES)
    return Capacity(worker_types=worker_types, master_types=master_types,
                    reservation_id=reservation_id, reservation_group_arn=reservation_group_arn,
                    capacity_block_id=capacity_block_id, max_zone_moves=moves,
                    capacity_block_lead_minutes=lead)


#: Instance families EC2 does not launch into a cluster placement group (burstable T, Mac,
#: M7i-flex; placement group rules, linked above). Every GPU family (g, p, trn, inf) may.
_NO_CLUSTER_PLACEMENT = re.compile(r"^(t\d[a-z]*|mac\d[a-z0-9-]*|m7i-flex)\.")


def check_cluster_placement(capacity: Capacity) -> None:
    """ConfigError when a type of the nodes cannot launch into a cluster placement group:
    every launch would fail, so say it at synth with the way out."""
    bad = [t for t in dict.fromkeys(capacity.master_types + capacity.worker_types)
           if _NO_CLUSTER_PLACEMENT.match(t)]
    if bad:
        raise validation.ConfigError(
            f"{', '.join(bad)} cannot launch into a cluster placement group (EC2 takes no "
            f"burstable T, Mac or M7i-flex instance there), and the nodes start in one "
            f"(create_placement_group, the placementGroup setting, true by default): give "
            f"placementGroup=false (create_placement_group=False) or another type")


def reserve(template: ec2.LaunchTemplate, capacity: Capacity) -> None:
    """Target the reservation (or block) from ``template``'s launch data; no-op without one.

    A targeted reservation launches only into that reservation: a launch fails when it is
    full or expired instead of falling back to On-Demand capacity elsewhere."""
    cfn: ec2.CfnLaunchTemplate = template.node.default_child  # type: ignore[assignment]
    target: dict[str, str] = {}
    if capacity.reservation_id or capacity.capacity_block_id:
        target["CapacityReservationId"] = str(capacity.reservation_id
                                              or capacity.capacity_block_id)
    elif capacity.reservation_group_arn:
        target["CapacityReservationResourceGroupArn"] = capacity.reservation_group_arn
    else:
        return
    cfn.add_property_override("LaunchTemplateData.CapacityReservationSpecification",
                              {"CapacityReservationTarget": target})
    if capacity.capacity_block_id:
        cfn.add_property_override("LaunchTemplateData.InstanceMarketOptions",
                                  {"MarketType": "capacity-block"})


@dataclass(frozen=True)
class ZonePlan:
    """The subnets each group starts in, and the single-zone fallback order.

    ``choices``: (zone, private subnet) in fallback order, first = where both groups start;
    empty when the groups span every zone (no fallback needed: Auto Scaling picks the zone).
    """

    node_subnets: ec2.SubnetSelection
    master_subnets: ec2.SubnetSelection
    choices: tuple[tuple[str, ec2.ISubnet], ...]

    @property
    def single_zone(self) -> bool:
        return bool(self.choices)


def zone_plan(vpc: ec2.IVpc, *, single_zone: bool, fallback: bool,
              zones: Sequence[str] | None, public_master: bool,
              reservation_prop: str = "") -> ZonePlan:
    """Pick the node subnets (docs/capacity-adjuster.md, "Zones").

    ``single_zone`` (a placement group, EFA or a reservation): one zone, the first of
    ``zones`` (or of the VPC); with ``fallback`` the other zones follow as the adjuster's
    move order. Otherwise the private subnets of every zone (of ``zones`` when given).
    A reservation (``reservation_prop`` names it) is zonal: ``zones`` must be given, the
    reservation's zone first, so the nodes start where the reserved capacity is."""
    if reservation_prop and not zones:
        raise validation.ConfigError(
            f"{reservation_prop} needs availability_zones, the reservation's zone first "
            f"(aws ec2 describe-capacity-reservations --capacity-reservation-ids <id> "
            f"--query 'CapacityReservations[0].AvailabilityZone'): a reservation launches "
            f"instances only in its own zone")
    private = vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets
    if not private:
        raise validation.ConfigError("the VPC has no private subnets with egress for the nodes")
    if zones:
        by_zone = {s.availability_zone: s for s in private}
        missing = [z for z in zones if z not in by_zone]
        if missing and not any(_unresolved(z) for z in by_zone):
            raise validation.ConfigError(
                f"availability_zones names {', '.join(missing)}, where the VPC has no private "
                f"subnet (it has {', '.join(sorted(by_zone))})")
        private = [by_zone[z] for z in zones if z in by_zone] or private
    chosen = private[:1] if single_zone else private
    nodes = ec2.SubnetSelection(subnets=list(chosen))
    master = nodes
    if public_master:
        wanted = {s.availability_zone for s in chosen}
        public = [s for s in vpc.public_subnets if s.availability_zone in wanted] \
            or list(vpc.public_subnets)
        if not public:
            raise validation.ConfigError("ssh_cidr needs a public subnet for the master")
        master = ec2.SubnetSelection(subnets=public[:1] if single_zone else public)
    choices = tuple((s.availability_zone, s) for s in private) if single_zone else ()
    if single_zone and (not fallback or public_master):
        choices = choices[:1]
    return ZonePlan(node_subnets=nodes, master_subnets=master, choices=choices)


def _unresolved(value: str) -> bool:
    from aws_cdk import Token

    return Token.is_unresolved(value)

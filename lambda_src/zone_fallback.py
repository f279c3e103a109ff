"""Zone fallback for a single-zone cluster: when launches fail for capacity, move the groups
to the next zone a bounded number of times before the worker count is lowered.

A cluster with a placement group or EFA keeps every node in one zone (a cluster placement
group cannot span zones; EFA traffic stays in one subnet). Auto Scaling cannot look for
capacity elsewhere by itself, so this module decides, from the notification and the groups'
state only (pure functions, no AWS calls), whether to move both groups to the next zone of
the order the construct gave (``ZONE_CHOICES``: ``zone|subnet|placement-group`` entries,
first = where the groups started; ``MAX_ZONE_MOVES``).

The number of moves made so far is the position of the groups' current subnet in that
order, so the function needs no state of its own: duplicate or late notifications about a
zone the group already left are recognised (``stale``) and neither move the group again nor
lower its capacity. Once the cluster has formed (the master agent protects the master
instance from scale-in at formation), nothing moves: the running nodes stay with the master.

The insufficient-capacity text is EC2's, as Auto Scaling puts it in the launch error's
``StatusMessage`` (for a mixed instances group prefixed by "Could not launch On-Demand
Instances. InsufficientInstanceCapacity - "): "We currently do not have sufficient <type>
capacity in the Availability Zone you requested (<zone>). ..."
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: Phrases of a launch that failed because EC2 had no capacity (not a limit or a bad config).
CAPACITY_MARKERS = ("InsufficientInstanceCapacity", "do not have sufficient",
                    "insufficient capacity", "InsufficientCapacity")
_FAILED_TYPE = re.compile(r"sufficient ([a-z][a-z0-9-]*\.[a-z0-9-]+) capacity")

MOVE, STAY, STALE = "move", "stay", "stale"


@dataclass(frozen=True)
class ZoneChoice:
    """One zone the groups may run in: its private subnet and its placement group ("")."""

    zone: str
    subnet: str
    placement_group: str = ""


@dataclass(frozen=True)
class ZoneMove:
    """What to do about the zone after a launch notification.

    ``action``: ``move`` (both groups to ``target``), ``stale`` (the failure is about a zone
    the groups already left: nothing to do, the new zone's launches are under way) or
    ``stay`` (zone fallback does not apply; the capacity rule decides)."""

    action: str
    reason: str
    target: ZoneChoice | None = None
    moves_done: int = 0


def parse_choices(value: str) -> tuple[ZoneChoice, ...]:
    """``zone|subnet|pg,zone|subnet|pg`` (``ZONE_CHOICES``); malformed entries are dropped."""
    out = []
    for entry in (value or "").split(","):
        parts = entry.strip().split("|")
        if len(parts) == 3 and parts[0] and parts[1]:
            out.append(ZoneChoice(parts[0], parts[1], parts[2]))
    return tuple(out)


def is_capacity_error(text: str) -> bool:
    """The launch failed because EC2 had no capacity for it (the only case a move fixes)."""
    return any(marker.lower() in (text or "").lower() for marker in CAPACITY_MARKERS)


def failed_type(text: str) -> str:
    """The instance type EC2's message names ("" when it names none)."""
    match = _FAILED_TYPE.search(text or "")
    return match.group(1) if match else ""


def group_subnets(group: dict[str, Any]) -> tuple[str, ...]:
    """The group's subnets (``VPCZoneIdentifier``), in order."""
    return tuple(s.strip() for s in str(group.get("VPCZoneIdentifier") or "").split(",")
                 if s.strip())


def group_types(group: dict[str, Any]) -> tuple[str, ...]:
    """The types of a mixed instances group's overrides, in priority order (() otherwise)."""
    policy = group.get("MixedInstancesPolicy") or {}
    overrides = (policy.get("LaunchTemplate") or {}).get("Overrides") or []
    return tuple(str(o["InstanceType"]) for o in overrides
                 if isinstance(o, dict) and o.get("InstanceType"))


def instance_types(group: dict[str, Any]) -> tuple[str, ...]:
    """The types the group launches: its overrides, else the types of its instances (a
    group with one launch template type and no instance yet: ())."""
    launched = [str(i["InstanceType"]) for i in group.get("Instances") or []
                if isinstance(i, dict) and i.get("InstanceType")]
    return group_types(group) or tuple(dict.fromkeys(launched))


def formed(master_group: dict[str, Any] | None) -> bool:
    """The cluster formed: its master instance is protected from scale-in (the master agent
    sets that when it publishes the first membership)."""
    return any(bool(i.get("ProtectedFromScaleIn"))
               for i in (master_group or {}).get("Instances") or [] if isinstance(i, dict))


def index_of(subnets: tuple[str, ...], choices: tuple[ZoneChoice, ...]) -> int | None:
    """Position of a single-subnet group in the order (None: not one of the choices)."""
    if len(subnets) != 1:
        return None
    return next((i for i, c in enumerate(choices) if c.subnet == subnets[0]), None)


def decide_zone_move(*, launch_error: bool, status_message: str, failed_zone: str,
                     subnets: tuple[str, ...], choices: tuple[ZoneChoice, ...], max_moves: int,
                     cluster_formed: bool) -> ZoneMove:
    """The zone rule (module docstring), as a table of cases:

    not a launch error / fewer than two choices / no moves allowed / not a capacity error /
    group not in a choice → stay; failure in a zone the group already left → stale; cluster
    formed → stay; ``max_moves`` made or no zone left → stay; otherwise → move to the next.
    """
    if not launch_error:
        return ZoneMove(STAY, "not a launch error")
    if len(choices) < 2 or max_moves <= 0:
        return ZoneMove(STAY, "zone fallback is off (one zone, or no moves allowed)")
    if not is_capacity_error(status_message):
        return ZoneMove(STAY, "the launch failed for another reason than capacity")
    index = index_of(subnets, choices)
    if index is None:
        return ZoneMove(STAY, f"the group's subnets {','.join(subnets)} are not one of the "
                              f"cluster's zone choices")
    current = choices[index]
    if failed_zone and failed_zone != current.zone:
        return ZoneMove(STALE, f"the failed launch was in {failed_zone}, which the group "
                               f"already left for {current.zone}", moves_done=index)
    if cluster_formed:
        return ZoneMove(STAY, f"the cluster has formed; its nodes stay in {current.zone} "
                              f"with the master", moves_done=index)
    if index >= max_moves:
        return ZoneMove(STAY, f"the groups already moved {index} time(s), the most allowed "
                              f"(maxZoneMoves {max_moves})", moves_done=index)
    if index + 1 >= len(choices):
        return ZoneMove(STAY, f"no zone left after {current.zone}", moves_done=index)
    target = choices[index + 1]
    return ZoneMove(MOVE, f"no capacity in {current.zone}: moving the master and worker "
                          f"groups to {target.zone} (move {index + 1} of at most "
                          f"{min(max_moves, len(choices) - 1)})", target=target,
                    moves_done=index)


def attempts(*, subnets: tuple[str, ...], choices: tuple[ZoneChoice, ...],
             types: tuple[str, ...], failed_zone: str, status_message: str,
             decision: str) -> list[dict[str, Any]]:
    """What was tried, per zone: every zone the groups moved away from (for capacity), and
    the zone of this launch error (with EC2's message and the decision taken)."""
    out: list[dict[str, Any]] = []
    index = index_of(subnets, choices)
    for choice in choices[:index or 0]:
        out.append({"zone": choice.zone, "instance_types": list(types),
                    "cause": "insufficient capacity", "decision": MOVE})
    if status_message:
        named = failed_type(status_message)
        out.append({"zone": failed_zone or (choices[index].zone if index is not None else ""),
                    "instance_types": list(types) or ([named] if named else []),
                    "cause": status_message, "decision": decision})
    return out

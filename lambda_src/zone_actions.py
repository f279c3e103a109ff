"""Carrying out a zone move (``zone_fallback`` decides it) and collecting what was tried.

A move points BOTH groups at the next zone's subnet (and that zone's cluster placement
group, which is set on the group, not the launch template, so UpdateAutoScalingGroup can
change it), then replaces every instance either group still has outside that subnet
(TerminateInstanceInAutoScalingGroup without decrementing: Auto Scaling launches the
replacement in the new zone). It runs only before the cluster formed, so no running job
loses a node; the master agent on a replaced master never signalled the stack yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

try:  # imported as lambda_src.zone_actions (tests, installed package)
    from . import zone_fallback as zf
    from .aws_calls import AwsCallFailed, AwsClients
    from .json_log import JsonLogger
except ImportError:  # imported as zone_actions (Lambda: the asset root is on sys.path)
    import zone_fallback as zf  # type: ignore[no-redef]
    from aws_calls import AwsCallFailed, AwsClients  # type: ignore[no-redef]
    from json_log import JsonLogger  # type: ignore[no-redef]


@dataclass(frozen=True)
class ZoneSettings:
    """``ZONE_CHOICES`` and ``MAX_ZONE_MOVES`` of the function's environment."""

    choices: tuple[zf.ZoneChoice, ...] = ()
    max_moves: int = 0
    cluster_id: str = ""
    cluster_tag_key: str = ""
    role_tag_key: str = ""


@dataclass
class ZoneOutcome:
    """``action`` (zone_fallback's MOVE / STALE / STAY) and the attempts for asg-setup."""

    action: str
    reason: str
    attempts: list[dict[str, Any]] = field(default_factory=list)


def consider(*, launch_error: bool, status_message: str, failed_zone: str,
             group: dict[str, Any], settings: ZoneSettings, clients: AwsClients,
             log: JsonLogger) -> ZoneOutcome:
    """Decide about the zone after a launch / launch error of ``group``, and move if so."""
    subnets = zf.group_subnets(group)
    types = zf.group_types(group)
    decide = dict(launch_error=launch_error, status_message=status_message,
                  failed_zone=failed_zone, subnets=subnets, choices=settings.choices,
                  max_moves=settings.max_moves)
    move = zf.decide_zone_move(cluster_formed=False, **decide)
    groups: list[dict[str, Any]] = []
    if move.action == zf.MOVE:  # only now is the other group worth reading
        groups = clients.cluster_groups(settings.cluster_tag_key, settings.cluster_id)
        master = next((g for g in groups if _role(g, settings.role_tag_key) == "master"), None)
        move = zf.decide_zone_move(cluster_formed=zf.formed(master), **decide)
    tried = zf.attempts(subnets=subnets, choices=settings.choices, types=types,
                        failed_zone=failed_zone, status_message=status_message,
                        decision=move.action if move.action != zf.STAY else "")
    if move.action == zf.MOVE and move.target is not None:
        _move(groups or [group], move.target, clients, log)
    if move.action != zf.STAY or launch_error:
        log.info("zone-decision", action=move.action, reason=move.reason,
                 cause=status_message, failed_zone=failed_zone,
                 target_zone=move.target.zone if move.target else "",
                 moves_done=move.moves_done)
    return ZoneOutcome(move.action, move.reason, tried)


def _role(group: dict[str, Any], role_tag_key: str) -> str:
    tags = {t.get("Key"): t.get("Value") for t in group.get("Tags") or []
            if isinstance(t, dict)}
    return str(tags.get(role_tag_key, "")).lower()


def _move(groups: list[dict[str, Any]], target: zf.ZoneChoice, clients: AwsClients,
          log: JsonLogger) -> None:
    """Both groups to ``target``; their instances in other zones replaced there (an
    instance already in ``target``'s zone, e.g. after a concurrent move, stays)."""
    for group in groups:
        name = str(group.get("AutoScalingGroupName", ""))
        if zf.group_subnets(group) != (target.subnet,):
            clients.move_group(name, target.subnet, target.placement_group)
            log.info("group-moved", moved_asg=name, zone=target.zone, subnet=target.subnet,
                     placement_group=target.placement_group)
        for instance in group.get("Instances") or []:
            iid = str(instance.get("InstanceId", ""))
            if not iid or instance.get("AvailabilityZone") == target.zone or \
                    str(instance.get("LifecycleState", "")).startswith("Terminating"):
                continue
            try:
                clients.replace_instance(iid)
            except AwsCallFailed as exc:  # already gone: nothing left to replace
                log.warning("replace-skipped", instance=iid, code=exc.code, detail=exc.detail)
                continue
            log.info("instance-replaced", moved_asg=name, instance=iid, zone=target.zone)

"""The messages the adjuster puts on the master queue (docs/protocol.md §3).

Every message carries a ``dedupe_key`` computed from the group's state only (group, message
kind, desired, launched, sorted instance ids), never from the notification or the clock, so
a duplicate or re-ordered notification produces an identical key and the master agent can
drop it.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any


def dedupe_key(*, asg: str, kind: str, desired: int, launched: int, instances: list[str]) -> str:
    """Hex digest of the group state a message describes (same state ⇒ same key)."""
    canonical = json.dumps([asg, kind, desired, launched, sorted(instances)], separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def asg_setup(
    *,
    status: str,
    asg: str,
    role: str,
    cluster_id: str,
    min_size: int,
    desired: int,
    max_size: int,
    instances: list[str],
    reason: str,
    cause: str,
    decision: str = "",
    attempts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An ``asg-setup`` message; counts must be those AFTER any capacity change.

    ``decision``: what the adjuster did (``report`` or ``lower``); ``attempts``: what was
    tried, per zone (``zone``, ``instance_types``, ``cause``: EC2's message, ``decision``:
    ``move`` / ``stale`` / ""), for the master's failure reason and its launch record."""
    instances = sorted(instances)
    return {
        "event": "asg-setup",
        "status": status,
        "asg": asg,
        "role": role,
        "cluster_id": cluster_id,
        "min": min_size,
        "desired": desired,
        "max": max_size,
        "launched": len(instances),
        "instances": instances,
        "reason": reason,
        "cause": cause,
        "decision": decision,
        "attempts": list(attempts or []),
        "dedupe_key": dedupe_key(
            asg=asg,
            kind=f"asg-setup:{status}",
            desired=desired,
            launched=len(instances),
            instances=instances,
        ),
        "sent_at": _now(),
    }


def membership_change(
    *,
    change: str,
    asg: str,
    role: str,
    cluster_id: str,
    instance_id: str,
    desired: int,
    instances: list[str],
) -> dict[str, Any]:
    """A ``membership-change`` message (an instance left, or failed to leave)."""
    return {
        "event": "membership-change",
        "change": change,
        "asg": asg,
        "role": role,
        "cluster_id": cluster_id,
        "instance_id": instance_id,
        "desired": desired,
        "launched": len(instances),
        "dedupe_key": dedupe_key(
            asg=asg,
            kind=f"membership-change:{change}:{instance_id}",
            desired=desired,
            launched=len(instances),
            instances=instances,
        ),
        "sent_at": _now(),
    }


def drain_request(
    *,
    asg: str,
    role: str,
    cluster_id: str,
    instance_id: str,
    lifecycle_hook: str,
    lifecycle_action_token: str,
) -> dict[str, Any]:
    """A ``drain-request`` message (protocol.md §7): the instance waits in Terminating:Wait
    until the master agent completes the lifecycle action with these hook/token values.

    The key covers the lifecycle action itself (group, instance, hook, token): a re-delivered
    notification is the same drain, a later termination of the same instance is not."""
    return {
        "event": "drain-request",
        "asg": asg,
        "role": role,
        "cluster_id": cluster_id,
        "instance_id": instance_id,
        "lifecycle_hook": lifecycle_hook,
        "lifecycle_action_token": lifecycle_action_token,
        "dedupe_key": dedupe_key(
            asg=asg,
            kind=f"drain-request:{instance_id}:{lifecycle_hook}:{lifecycle_action_token}",
            desired=0,
            launched=0,
            instances=[instance_id],
        ),
        "sent_at": _now(),
    }

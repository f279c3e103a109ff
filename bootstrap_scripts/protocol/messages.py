"""Messages on the master queue (capacity-adjuster Lambda -> master agent), parsed strictly.

The Lambda builds these bodies in ``lambda_src/master_messages.py`` (its asset ships only
``lambda_src/``); a test holds its builders to the dataclasses here, field by field.
Anything the agent cannot interpret becomes a :class:`BadMessage` with a reason, so it can
log and delete it instead of crashing or re-reading it forever.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

ROLES = ("master", "worker")
EVENTS = ("asg-setup", "membership-change", "drain-request")


@dataclass(frozen=True)
class AsgSetup:
    """``asg-setup``: a group reached its (possibly lowered) desired capacity, or cannot."""

    EVENT = "asg-setup"
    status: str  # "success" | "failure"
    asg: str
    role: str
    cluster_id: str
    desired: int
    launched: int
    min: int = 0
    max: int = 0
    instances: tuple[str, ...] = ()
    reason: str = ""
    cause: str = ""
    #: What the adjuster did (``report`` / ``lower``) and what was tried, per zone:
    #: ``{"zone", "instance_types", "cause" (EC2's message), "decision"}`` (``move`` when the
    #: groups left that zone for capacity).
    decision: str = ""
    attempts: tuple[dict, ...] = ()
    dedupe_key: str = ""


@dataclass(frozen=True)
class MembershipChange:
    """``membership-change``: an instance left (or failed to leave) a group."""

    EVENT = "membership-change"
    change: str  # terminate | terminate-error
    asg: str
    role: str
    cluster_id: str
    instance_id: str = ""
    desired: int = 0
    launched: int = 0
    dedupe_key: str = ""


@dataclass(frozen=True)
class DrainRequest:
    """``drain-request``: a worker is terminating (lifecycle hook ``drain``): drain it, then
    complete the lifecycle action with these hook/token values."""

    EVENT = "drain-request"
    asg: str
    role: str
    cluster_id: str
    instance_id: str
    lifecycle_hook: str
    lifecycle_action_token: str
    dedupe_key: str = ""


@dataclass(frozen=True)
class BadMessage:
    reason: str
    body: str = field(repr=False, default="")


Message = AsgSetup | MembershipChange | DrainRequest | BadMessage
MESSAGE_TYPES = (AsgSetup, MembershipChange, DrainRequest)


def body_fields(cls: type) -> set[str]:
    """The JSON keys a message of ``cls`` carries: its fields plus ``event`` and ``sent_at``."""
    return {f.name for f in dataclasses.fields(cls)} | {"event", "sent_at"}


def parse_message(body: str) -> Message:
    """Turn an SQS body into a typed message, or a BadMessage naming what is wrong."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, TypeError) as exc:
        return BadMessage(f"not JSON: {exc}", str(body)[:500])
    if not isinstance(data, dict):
        return BadMessage(f"not a JSON object: {type(data).__name__}", body[:500])
    # Tolerate an SNS envelope (raw message delivery off): the payload is in "Message".
    if "event" not in data and isinstance(data.get("Message"), str):
        return parse_message(data["Message"])
    event = data.get("event")
    if event not in EVENTS:
        return BadMessage(f"unknown event {event!r}", body[:500])
    try:
        role = str(data["role"])
        if role not in ROLES:
            return BadMessage(f"unknown role {role!r}", body[:500])
        if event == AsgSetup.EVENT:
            status = str(data["status"])
            if status not in ("success", "failure"):
                return BadMessage(f"unknown asg-setup status {status!r}", body[:500])
            instances = data.get("instances") or []
            if not isinstance(instances, list):
                return BadMessage(f"'instances' must be a list, got {instances!r}", body[:500])
            attempts = data.get("attempts") or []
            if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
                return BadMessage(f"'attempts' must be a list of objects, got {attempts!r}",
                                  body[:500])
            return AsgSetup(
                status=status, asg=str(data["asg"]), role=role,
                cluster_id=str(data.get("cluster_id", "")),
                desired=int(data["desired"]), launched=int(data.get("launched", 0)),
                min=int(data.get("min", 0)), max=int(data.get("max", 0)),
                instances=tuple(str(i) for i in instances),
                reason=str(data.get("reason", "")), cause=str(data.get("cause", "")),
                decision=str(data.get("decision", "")), attempts=tuple(attempts),
                dedupe_key=str(data.get("dedupe_key", "")),
            )
        if event == DrainRequest.EVENT:
            fields = {k: str(data[k]) for k in ("asg", "instance_id", "lifecycle_hook",
                                                 "lifecycle_action_token")}
            empty = [k for k, v in fields.items() if not v]
            if empty:
                return BadMessage(f"drain-request has empty {', '.join(empty)}", body[:500])
            return DrainRequest(role=role, cluster_id=str(data.get("cluster_id", "")),
                                dedupe_key=str(data.get("dedupe_key", "")), **fields)
        return MembershipChange(
            change=str(data["change"]), asg=str(data["asg"]), role=role,
            cluster_id=str(data.get("cluster_id", "")),
            instance_id=str(data.get("instance_id", "")),
            desired=int(data.get("desired", 0)), launched=int(data.get("launched", 0)),
            dedupe_key=str(data.get("dedupe_key", "")),
        )
    except KeyError as exc:
        return BadMessage(f"{event} message lacks field {exc}", body[:500])
    except (TypeError, ValueError) as exc:
        return BadMessage(f"{event} message has a bad value: {exc}", body[:500])

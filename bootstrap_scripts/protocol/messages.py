"""Messages on the master queue (capacity-adjuster Lambda -> master agent), parsed strictly.

The Lambda builds these bodies in ``lambda_src/master_messages.py`` (its asset ships only
``lambda_src/``); a test holds its builders to the dataclasses here, field by field.
Anything the agent cannot interpret becomes a :class:`BadMessage` with a reason, so it can
log and delete it instead of crashing or re-reading it forever.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from bootstrap_scripts.protocol import bounds, record_base
from bootstrap_scripts.protocol.errors import ProtocolError

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


#: The documented range of each numeric field (docs/protocol.md, "Numbers").
NUMBER_RANGES: dict[type, dict[str, tuple[int, int]]] = {
    AsgSetup: {"desired": bounds.COUNT, "launched": bounds.COUNT, "min": bounds.COUNT,
               "max": bounds.COUNT},
    MembershipChange: {"desired": bounds.COUNT, "launched": bounds.COUNT},
    DrainRequest: {},
}
#: Longest text field kept from a message (reasons and EC2 causes are a few hundred).
MAX_TEXT = 10_000


def parse_message(body: str) -> Message:
    """Turn an SQS body into a typed message, or a BadMessage naming what is wrong (the
    field and its value); it never raises, whatever the body holds."""
    try:
        return _parse(body)
    except ProtocolError as exc:
        return BadMessage(str(exc), _clip(body))
    except Exception as exc:  # nothing in a body may crash the agent's loop
        return BadMessage(f"unreadable message: {exc!r}", _clip(body))


def _clip(body: object) -> str:
    return body[:500] if isinstance(body, str) else repr(body)[:500]


def _parse(body: str) -> Message:
    try:
        data = record_base.loads(body)
    except (ValueError, TypeError) as exc:  # ValueError: also a 5,000-digit number
        return BadMessage(f"not JSON: {exc}", _clip(body))
    if not isinstance(data, dict):
        return BadMessage(f"not a JSON object: {type(data).__name__}", body[:500])
    # Tolerate an SNS envelope (raw message delivery off): the payload is in "Message".
    if "event" not in data and isinstance(data.get("Message"), str):
        return _parse(data["Message"])
    event = data.get("event")
    if event not in EVENTS:
        return BadMessage(f"unknown event {_short(event)}", body[:500])
    try:
        role = _text(data, "role", event)
        if role not in ROLES:
            return BadMessage(f"unknown role {role!r}", body[:500])
        if event == AsgSetup.EVENT:
            return _asg_setup(data, role, body)
        if event == DrainRequest.EVENT:
            fields = {k: _text(data, k, event) for k in ("asg", "instance_id", "lifecycle_hook",
                                                         "lifecycle_action_token")}
            empty = [k for k, v in fields.items() if not v]
            if empty:
                return BadMessage(f"drain-request has empty {', '.join(empty)}", body[:500])
            return DrainRequest(role=role, cluster_id=_text(data, "cluster_id", event, ""),
                                dedupe_key=_text(data, "dedupe_key", event, ""), **fields)
        return MembershipChange(
            change=_text(data, "change", event), asg=_text(data, "asg", event), role=role,
            cluster_id=_text(data, "cluster_id", event, ""),
            instance_id=_text(data, "instance_id", event, ""),
            dedupe_key=_text(data, "dedupe_key", event, ""),
            **_counts(data, MembershipChange, event),
        )
    except KeyError as exc:
        return BadMessage(f"{event} message lacks field {exc}", body[:500])


def _asg_setup(data: dict, role: str, body: str) -> Message:
    event = AsgSetup.EVENT
    status = _text(data, "status", event)
    if status not in ("success", "failure"):
        return BadMessage(f"unknown asg-setup status {status!r}", body[:500])
    instances = data.get("instances") or []
    if not isinstance(instances, list) or not all(isinstance(i, str) for i in instances):
        return BadMessage(f"'instances' must be a list, got {_short(instances)}", body[:500])
    if len(instances) > bounds.MAX_NODES:
        return BadMessage(f"'instances' lists {len(instances)} ids, more than "
                          f"{bounds.MAX_NODES}", body[:500])
    attempts = data.get("attempts") or []
    if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
        return BadMessage(f"'attempts' must be a list of objects, got {_short(attempts)}",
                          body[:500])
    if "desired" not in data:
        raise KeyError("desired")
    return AsgSetup(
        status=status, asg=_text(data, "asg", event), role=role,
        cluster_id=_text(data, "cluster_id", event, ""),
        **_counts(data, AsgSetup, event),
        instances=tuple(instances),
        reason=_text(data, "reason", event, ""), cause=_text(data, "cause", event, ""),
        decision=_text(data, "decision", event, ""),
        attempts=tuple(_attempt(a, i) for i, a in enumerate(attempts)),
        dedupe_key=_text(data, "dedupe_key", event, ""),
    )


def _counts(data: dict, cls: type, event: str) -> dict[str, int]:
    """The message's counts, each checked against :data:`NUMBER_RANGES` (absent: 0)."""
    return {name: bounds.whole(data.get(name, 0), field=name, low=low, high=high,
                               source=f"{event} message")
            for name, (low, high) in NUMBER_RANGES[cls].items()}


def _text(data: dict, name: str, event: str, default: str | None = None) -> str:
    """A text field: a JSON string (a number or an object is refused), at most MAX_TEXT."""
    if name not in data:
        if default is None:
            raise KeyError(name)
        return default
    value = data[name]
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ProtocolError(f"expected a string of at most {MAX_TEXT} characters, got "
                            f"{_short(value)}", source=f"{event} message", field=name)
    return value


def _attempt(item: dict, index: int) -> dict:
    """One entry of ``attempts``: its text fields as strings, ``instance_types`` a list of
    strings (what :mod:`.launches` records)."""
    where = "asg-setup message"
    out = {k: _text(item, k, where, "") for k in ("zone", "cause", "decision")}
    types = item.get("instance_types") or []
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ProtocolError(f"expected a list of strings, got {_short(types)}", source=where,
                            field=f"attempts[{index}].instance_types")
    return {**out, "instance_types": list(types)}


def _short(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:
        return "a number too long to show"
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"

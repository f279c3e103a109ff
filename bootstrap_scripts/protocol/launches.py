"""Launch diagnostics: what failed to launch, per zone and instance type, and why.

The capacity adjuster reports what was tried in each ``asg-setup`` message (``attempts``:
zones a single-zone cluster left for lack of capacity, and the zone of a launch error with
EC2's message). The master agent keeps them on EFS (``cluster/launch-failures.json``,
:class:`~bootstrap_scripts.protocol.records.LaunchFailures`) with :func:`record_attempts`,
and names them in its wait-condition failure reason (:func:`setup_failure_reason`), so the
stack's failure says which zone and type had no capacity. ``dl-health`` / ``dlc`` read them
with :func:`launch_failures` and show each line with :func:`describe`.
"""

from __future__ import annotations

import time
from typing import Any

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.messages import AsgSetup
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import LaunchAttempt, LaunchFailures

#: The file keeps the newest attempts only (a cluster that keeps failing must not grow it).
MAX_KEPT = 200
#: A cause longer than this is clipped in the one-line reason (the record keeps it whole).
REASON_CAUSE_CHARS = 160


def attempts_of(msg: AsgSetup, now: float | None = None) -> list[LaunchAttempt]:
    """The failed attempts an ``asg-setup`` message reports, as records."""
    at = time.time() if now is None else now
    out = []
    for item in msg.attempts:
        types = item.get("instance_types") or []
        out.append(LaunchAttempt(
            role=msg.role, asg=msg.asg, zone=str(item.get("zone", "")),
            instance_types=tuple(str(t) for t in types) if isinstance(types, list) else (),
            cause=str(item.get("cause", "")), decision=str(item.get("decision", "")), at=at))
    return out


def _key(a: LaunchAttempt) -> tuple[Any, ...]:
    return (a.role, a.asg, a.zone, a.instance_types, a.cause, a.decision)


def record_attempts(paths: ClusterPaths, msg: AsgSetup, now: float | None = None) -> int:
    """Add the message's attempts to ``cluster/launch-failures.json`` (an attempt already
    there, e.g. from a duplicate message, is not added twice); returns how many were new."""
    new = attempts_of(msg, now)
    if not new:
        return 0
    kept = list(launch_failures(paths))
    seen = {_key(a) for a in kept}
    added = [a for a in new if _key(a) not in seen]
    if added:
        try:
            store.write_record(paths.launch_failures,
                               LaunchFailures(attempts=tuple((kept + added)[-MAX_KEPT:])))
        except OSError:  # a diagnostic: never worth failing the setup it describes
            return 0
    return len(added)


def launch_failures(paths: ClusterPaths) -> tuple[LaunchAttempt, ...]:
    """Every recorded failed launch attempt, oldest first (() when none was recorded)."""
    doc = store.read_record_or_none(paths.launch_failures, LaunchFailures)
    return doc.attempts if doc is not None else ()


def describe(attempt: LaunchAttempt | dict[str, Any]) -> str:
    """One attempt as a line: ``zone us-east-1a, p5.48xlarge/p4d.24xlarge: <cause> (moved)``."""
    if isinstance(attempt, LaunchAttempt):
        zone, types, cause, decision = (attempt.zone, attempt.instance_types, attempt.cause,
                                        attempt.decision)
    else:
        zone, types = str(attempt.get("zone", "")), attempt.get("instance_types") or []
        cause, decision = str(attempt.get("cause", "")), str(attempt.get("decision", ""))
    if len(cause) > REASON_CAUSE_CHARS:
        cause = cause[:REASON_CAUSE_CHARS - 3] + "..."
    where = f"zone {zone or '?'}" + (f", {'/'.join(str(t) for t in types)}" if types else "")
    then = {"move": " (moved to the next zone)", "stale": ""}.get(decision, "")
    return f"{where}: {cause or 'failed'}{then}"


def setup_failure_reason(msg: AsgSetup) -> str:
    """The wait-condition failure reason for an ``asg-setup`` failure: the group, the
    adjuster's reason, the AWS cause, and every zone and type that was tried."""
    cause = f" ({msg.cause})" if msg.cause else ""
    reason = f"{msg.role} group {msg.asg}: {msg.reason}{cause}"
    if msg.attempts:
        reason += "; tried: " + "; ".join(describe(a) for a in msg.attempts)
    return reason

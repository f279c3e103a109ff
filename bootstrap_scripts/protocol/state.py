"""The cluster's state on EFS, as operations: publish a generation, read the live one,
list registrations, drains and data-preparation outcomes.

Paths come from :mod:`~bootstrap_scripts.protocol.paths`, records from
:mod:`~bootstrap_scripts.protocol.records`; every write goes through
:mod:`~bootstrap_scripts.protocol.store`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import ClassVar

from bootstrap_scripts.protocol import bounds, store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.membership import Membership, MembershipError, membership_changes
from bootstrap_scripts.protocol.membership_signature import Signer, signed_text
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.record_base import Record, record
from bootstrap_scripts.protocol.records import DrainRecord, Registration


@record
class WaitSignal(Record):
    """``cluster/wait-condition.json``: the master signalled the stack's wait condition.
    Written right after the signal, read before any signal: a master that restarts (or a
    membership that had to be rebuilt) never signals a second time."""

    KIND: ClassVar[str] = "wait-condition signal"
    cluster_id: str
    status: str  # SUCCESS | FAILURE
    instance_id: str
    generation: int = 0
    signalled_at: float = 0.0
    reason: str = ""

#: The documented range of each numeric field of the records the agent reads
#: (docs/protocol.md, "Numbers"); the records module checks types, this the values.
RECORD_RANGES: dict[type, dict[str, tuple[float, float]]] = {
    Registration: {"gpus": (0, bounds.MAX_GPUS), "agent_pid": (0, bounds.MAX_PID),
                   "started_at": bounds.TIME, "heartbeat": bounds.TIME,
                   "generation_applied": (0, bounds.MAX_GENERATION)},
    DrainRecord: {"requested_at": bounds.TIME, "deadline": bounds.TIME,
                  "attempts": (0, bounds.MAX_ATTEMPTS), "retry_at": bounds.TIME,
                  "completed_at": bounds.TIME, "seconds": bounds.SECONDS},
    WaitSignal: {"generation": (0, bounds.MAX_GENERATION), "signalled_at": bounds.TIME},
}
_log = logging.getLogger("dl-agent.records")
_refused: set[str] = set()


def read_checked(path: str | os.PathLike, cls: type, ranges: dict | None = None):
    """The record at ``path`` with its numbers in range, or None (missing, malformed, larger
    than ``store.NODE_RECORD_LIMIT`` or out of range: the reason, naming the field and value,
    is logged once per file and reason)."""
    try:
        rec = store.read_record(path, cls, limit=store.NODE_RECORD_LIMIT)
        if rec is not None:
            bounds.check_fields(rec, RECORD_RANGES.get(cls, {}) if ranges is None else ranges,
                                source=str(path))
        return rec
    except ProtocolError as exc:
        if str(exc) not in _refused and len(_refused) < 10_000:
            _refused.add(str(exc))
            _log.warning("event=refused-record error=%s", exc)
    except OSError:
        pass
    return None


def read_checked_fields(rec: Record, ranges: dict, *, source: str) -> bool:
    """True when ``rec``'s numbers are in ``ranges`` (else logged like :func:`read_checked`);
    for records nested in another record."""
    try:
        bounds.check_fields(rec, ranges, source=source)
    except ProtocolError as exc:
        _log.warning("event=refused-record error=%s", exc)
        return False
    return True


def _scan_checked(directory: Path, cls: type[Record]) -> list[Record]:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    found = (read_checked(e.path, cls) for e in entries
             if e.name.endswith(".json") and not e.name.startswith("."))
    return [rec for rec in found if rec is not None]


def read_current(efs: str | os.PathLike) -> Membership | None:
    """The live membership, None before the first one. Raises MembershipError (naming the
    file) when it is malformed."""
    try:
        return Membership.load(ClusterPaths(efs).membership)
    except FileNotFoundError:
        return None


def latest_generation(efs: str | os.PathLike) -> int:
    """Highest generation ever published here (so a restarted master keeps counting up)."""
    paths = ClusterPaths(efs)
    best = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(paths.generations_dir):
            stem = entry.name.removesuffix(".json")
            if entry.name.endswith(".json") and stem.isdigit():
                best = max(best, int(stem))
    with contextlib.suppress(OSError, MembershipError):
        current = read_current(efs)
        if current is not None:
            best = max(best, current.generation)
    return best


def read_generation(efs: str | os.PathLike, number: int) -> Membership | None:
    """``generations/<number>.json``, None when missing or unreadable."""
    try:
        return Membership.load(ClusterPaths(efs).generation(number))
    except (OSError, MembershipError):
        return None


def read_previous(efs: str | os.PathLike) -> Membership | None:
    """The last published generation, for the next one to be compared with: the live
    membership, or (when it is unreadable, e.g. truncated) the newest generation file, so
    a publish after a corrupt ``membership.json`` logs only the real changes."""
    try:
        return read_current(efs)
    except (OSError, MembershipError):
        return read_generation(efs, latest_generation(efs))


def restore_current(efs: str | os.PathLike, m: Membership,
                    sign: Signer | None = None) -> None:
    """Put ``m`` back as the live membership WITHOUT publishing: no new generation, no
    ``membership.log`` line (its nodes were logged when generation ``m.generation`` was
    published). ``generations/<N>.json`` is rewritten only when it is unreadable.
    ``sign``: the master's signer (``membership_signature``), None for an unsigned one."""
    paths = ClusterPaths(efs)
    text = signed_text(m.to_json(), sign) if sign else m.to_json()
    if read_generation(efs, m.generation) is None:
        store.atomic_write(paths.generation(m.generation), text)
    store.atomic_write(paths.membership, text)


def read_wait_signal(efs: str | os.PathLike) -> WaitSignal | None:
    return read_checked(ClusterPaths(efs).wait_signal, WaitSignal)


def write_wait_signal(efs: str | os.PathLike, rec: WaitSignal) -> None:
    store.write_record(ClusterPaths(efs).wait_signal, rec)


def publish(efs: str | os.PathLike, new: Membership, previous: Membership | None,
            sign: Signer | None = None) -> None:
    """Write generations/<N>.json, then swap cluster/membership.json, then log the changes.

    Order matters: the per-generation file exists before any watcher can see generation N
    in membership.json, and the log is only appended once N is live. ``sign``: the
    master's signer (workers apply only a signed document), None for an unsigned one.
    """
    paths = ClusterPaths(efs)
    text = signed_text(new.to_json(), sign) if sign else new.to_json()
    store.atomic_write(paths.generation(new.generation), text)
    store.atomic_write(paths.membership, text)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = "".join(f"{new.generation} {kind} {addr} {stamp}\n"
                    for kind, addr in membership_changes(previous, new))
    if lines:
        store.append_block(paths.membership_log, lines)


def write_registration(efs: str | os.PathLike, record: Registration,
                       sign: Signer | None = None) -> None:
    """Atomically (re)write a node's registration (its heartbeat, too), signed with the
    node's own key when ``sign`` is given (``protocol.node_signature``)."""
    path = ClusterPaths(efs).registration(record.instance_id)
    if sign is None:
        store.write_record(path, record)
    else:
        store.atomic_write(path, signed_text(record.to_json(), sign))


def read_registration(efs: str | os.PathLike, instance_id: str) -> Registration | None:
    """One node's registration (None: absent, or refused: see :func:`read_checked`)."""
    return read_checked(ClusterPaths(efs).registration(instance_id), Registration)


def read_registrations(efs: str | os.PathLike) -> dict[str, Registration]:
    """Every readable node registration, keyed by instance id (unreadable ones skipped)."""
    return {rec.instance_id: rec
            for rec in _scan_checked(ClusterPaths(efs).nodes_dir, Registration)}


def registered_ids(efs: str | os.PathLike) -> set[str]:
    """Instance ids with a registration file, from the directory listing alone (no file is
    read: cheap enough to call every second; a listing may lag a new file on NFS)."""
    suffix = ".json"
    try:
        entries = list(os.scandir(ClusterPaths(efs).nodes_dir))
    except FileNotFoundError:
        return set()
    return {e.name[: -len(suffix)] for e in entries
            if e.name.endswith(suffix) and not e.name.startswith(".")}


def forget_registration(efs: str | os.PathLike, instance_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        ClusterPaths(efs).registration(instance_id).unlink()


def read_drain(efs: str | os.PathLike, instance_id: str) -> DrainRecord | None:
    return read_checked(ClusterPaths(efs).drain_request(instance_id), DrainRecord)


def write_drain(efs: str | os.PathLike, record: DrainRecord,
                sign: Signer | None = None) -> None:
    """The drain record, signed with the master's key when ``sign`` is given (the draining
XX
    propagate and nothing is written."""
    path = ClusterPaths(efs).drain_request(record.instance_id)
    if sign is None:
        store.write_record(path, record)
    else:
        store.atomic_write(path, signed_text(record.to_json(), sign))


def drains(efs: str | os.PathLike) -> dict[str, DrainRecord]:
    """Every drain record, completed or not, keyed by instance id."""
    return {rec.instance_id: rec
            for rec in _scan_checked(ClusterPaths(efs).drain_dir, DrainRecord)}


def pending_drains(efs: str | os.PathLike) -> dict[str, DrainRecord]:
    """Drain records not completed yet (a restarted master picks them up again)."""
    return {iid: rec for iid, rec in drains(efs).items() if not rec.completed}


def prep_status(efs: str | os.PathLike, instance_id: str) -> str | None:
    """"ok", "failed" or None (not finished, or never run)."""
    paths = ClusterPaths(efs)
    for outcome in ("ok", "failed"):
        if store.exists(paths.prepared(instance_id, outcome)):
            return outcome
    return None

"""The cluster's state on EFS, as operations: publish a generation, read the live one,
list registrations, drains and data-preparation outcomes.

Paths come from :mod:`~bootstrap_scripts.protocol.paths`, records from
:mod:`~bootstrap_scripts.protocol.records`; every write goes through
:mod:`~bootstrap_scripts.protocol.store`.
"""

from __future__ import annotations

import contextlib
import os
import time

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import Membership, MembershipError, membership_changes
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import DrainRecord, Registration


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


def publish(efs: str | os.PathLike, new: Membership, previous: Membership | None) -> None:
    """Write generations/<N>.json, then swap cluster/membership.json, then log the changes.

    Order matters: the per-generation file exists before any watcher can see generation N
    in membership.json, and the log is only appended once N is live.
    """
    paths = ClusterPaths(efs)
    text = new.to_json()
    store.atomic_write(paths.generation(new.generation), text)
    store.atomic_write(paths.membership, text)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = "".join(f"{new.generation} {kind} {addr} {stamp}\n"
                    for kind, addr in membership_changes(previous, new))
    if lines:
        store.append_block(paths.membership_log, lines)


def write_registration(efs: str | os.PathLike, record: Registration) -> None:
    """Atomically (re)write a node's registration (its heartbeat, too)."""
    store.write_record(ClusterPaths(efs).registration(record.instance_id), record)


def read_registrations(efs: str | os.PathLike) -> dict[str, Registration]:
    """Every readable node registration, keyed by instance id (unreadable ones skipped)."""
    return {rec.instance_id: rec
            for _, rec in store.scan_records(ClusterPaths(efs).nodes_dir, Registration)}


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
    return store.read_record_or_none(ClusterPaths(efs).drain_request(instance_id), DrainRecord)


def write_drain(efs: str | os.PathLike, record: DrainRecord) -> None:
    store.write_record(ClusterPaths(efs).drain_request(record.instance_id), record)


def drains(efs: str | os.PathLike) -> dict[str, DrainRecord]:
    """Every drain record, completed or not, keyed by instance id."""
    return {rec.instance_id: rec
            for _, rec in store.scan_records(ClusterPaths(efs).drain_dir, DrainRecord)}


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

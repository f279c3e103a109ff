"""The cluster's state on the shared file system (protocol.md §5), read and written safely.

EFS gives close-to-open consistency: a reader that opens a file after the writer closed
(and renamed) it sees the whole new content. So every document here is written to a temp
file and renamed into place; readers never see half a JSON document.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts import membership as ms

#: Elastic membership (protocol.md §7), relative to the EFS mount point.
EFS_DRAIN_DIR = f"{ms.EFS_CLUSTER_DIR}/drain"
EFS_PREPARED_DIR = f"{ms.EFS_CLUSTER_DIR}/prepared"


def drain_path(efs: str | os.PathLike, instance_id: str) -> Path:
    """``cluster/drain/<id>.json``: the master asks this node to stop its job shares."""
    return Path(efs) / EFS_DRAIN_DIR / f"{instance_id}.json"


def drain_done_path(efs: str | os.PathLike, instance_id: str) -> Path:
    """``cluster/drain/<id>.done``: written by the node's job executor once its shares stopped."""
    return Path(efs) / EFS_DRAIN_DIR / f"{instance_id}.done"


def read_drain(efs: str | os.PathLike, instance_id: str) -> dict | None:
    try:
        record = json.loads(drain_path(efs, instance_id).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_drain(efs: str | os.PathLike, record: dict) -> None:
    ms.atomic_write(drain_path(efs, record["instance_id"]), json.dumps(record, sort_keys=True)
                    + "\n")


def pending_drains(efs: str | os.PathLike) -> dict[str, dict]:
    """Drain records not completed yet (a restarted master picks them up again)."""
    out: dict[str, dict] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(Path(efs) / EFS_DRAIN_DIR):
            if entry.name.endswith(".json") and not entry.name.startswith("."):
                record = read_drain(efs, entry.name.removesuffix(".json"))
                if record and not record.get("completed_at"):
                    out[str(record["instance_id"])] = record
    return out


def prepared_path(efs: str | os.PathLike, instance_id: str, outcome: str) -> Path:
    """``cluster/prepared/<id>.ok`` or ``.failed`` (``outcome`` is "ok" or "failed")."""
    return Path(efs) / EFS_PREPARED_DIR / f"{instance_id}.{outcome}"


def prep_status(efs: str | os.PathLike, instance_id: str) -> str | None:
    """"ok", "failed" or None (not finished, or never run). Opened, not stat'ed (NFS)."""
    for outcome in ("ok", "failed"):
        try:
            os.close(os.open(prepared_path(efs, instance_id, outcome), os.O_RDONLY))
        except FileNotFoundError:
            continue
        return outcome
    return None


def node_registration_path(efs: str | os.PathLike, instance_id: str) -> Path:
    return Path(efs) / ms.EFS_NODES_DIR / f"{instance_id}.json"


def write_registration(efs: str | os.PathLike, record: dict) -> None:
    """Atomically (re)write this node's registration (its heartbeat, too)."""
    path = node_registration_path(efs, record["instance_id"])
    ms.atomic_write(path, json.dumps(record, sort_keys=True) + "\n")


def read_registrations(efs: str | os.PathLike) -> dict[str, dict]:
    """Every readable node registration, keyed by instance id (unreadable ones skipped)."""
    out: dict[str, dict] = {}
    nodes_dir = Path(efs) / ms.EFS_NODES_DIR
    try:
        entries = list(os.scandir(nodes_dir))
    except FileNotFoundError:
        return out
    for entry in entries:
        if not entry.name.endswith(".json") or entry.name.startswith("."):
            continue
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(Path(entry.path).read_text())
            if isinstance(record, dict) and record.get("instance_id"):
                out[str(record["instance_id"])] = record
    return out


def read_current(efs: str | os.PathLike) -> ms.Membership | None:
    try:
        return ms.Membership.load(Path(efs) / ms.EFS_MEMBERSHIP)
    except FileNotFoundError:
        return None


def latest_generation(efs: str | os.PathLike) -> int:
    """Highest generation ever published here (so a restarted master keeps counting up)."""
    best = 0
    gen_dir = Path(efs) / ms.EFS_GENERATIONS_DIR
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(gen_dir):
            stem = entry.name.removesuffix(".json")
            if entry.name.endswith(".json") and stem.isdigit():
                best = max(best, int(stem))
    with contextlib.suppress(OSError, ms.MembershipError):
        current = read_current(efs)
        if current is not None:
            best = max(best, current.generation)
    return best


def membership_changes(old: ms.Membership | None, new: ms.Membership) -> list[tuple[str, str]]:
    """(ADDED|REMOVED, address) pairs between two generations, in membership order."""
    before = {n.address for n in old.nodes} if old else set()
    after = {n.address for n in new.nodes}
    changes = [("REMOVED", n.address) for n in (old.nodes if old else ()) if n.address not in after]
    changes += [("ADDED", n.address) for n in new.nodes if n.address not in before]
    return changes


def publish(efs: str | os.PathLike, new: ms.Membership, previous: ms.Membership | None) -> None:
    """Write generations/<N>.json, then swap cluster/membership.json, then log the changes.

    Order matters: the per-generation file exists before any watcher can see generation N
    in membership.json, and the log is only appended once N is live.
    """
    efs = Path(efs)
    text = new.to_json()
    ms.atomic_write(efs / ms.EFS_GENERATIONS_DIR / f"{new.generation}.json", text)
    ms.atomic_write(efs / ms.EFS_MEMBERSHIP, text)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = "".join(f"{new.generation} {kind} {addr} {stamp}\n"
                    for kind, addr in membership_changes(previous, new))
    if lines:
        log_path = efs / ms.EFS_MEMBERSHIP_LOG
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # One write() of the whole block with O_APPEND: lines from one generation stay together.
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)


@dataclass(frozen=True)
class FileStamp:
    """What a watcher compares between two stats: cheap and changes on every rename."""

    inode: int
    mtime_ns: int
    size: int


def stamp(path: str | os.PathLike) -> FileStamp | None:
    """open() + fstat(), not stat(): on NFS an open revalidates the name (close-to-open),
    while a bare stat() may answer from the attribute cache for up to a minute."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return FileStamp(st.st_ino, st.st_mtime_ns, st.st_size)


def touch_directory(path: str | os.PathLike) -> None:
    """Open a directory and close it again: asks the NFS client to revalidate it, so a file
    that appears in it (the first membership) is not hidden by a cached negative lookup."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY))

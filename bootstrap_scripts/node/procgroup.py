"""Process groups: every process we start is ours to stop, by PID or process group.

One module for the node agent (the data-preparation command), the job executor (a job's
share, whose torchrun workers start sessions of their own and are found by the share token
in their environment) and the local emulator (each emulated node is a process group).
Stopping is always a ``killpg`` on a group we created or a PID we recorded, never a search
by name. A recorded PID is only signalled if its start time still matches, so a
``--stop`` run long after the demo cannot hit an unrelated process that reused the number.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def alive(pid: int) -> bool:
    """True for a live process (zombies count as gone: they hold no resources but a slot)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def pids_in_groups(pgids: Iterable[int]) -> set[int]:
    """Every live process whose process group is one of ``pgids``."""
    wanted = set(pgids)
    found: set[int] = set()
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields and fields[0] != "Z" and int(fields[2]) in wanted:
                found.add(int(entry))
    return found


def descendants(roots: Iterable[int]) -> set[int]:
    """Every live descendant of ``roots`` (by parent PID). Needed because torchrun starts
    its workers with ``start_new_session=True``: they leave the share's process group, so a
    ``killpg`` alone would orphan them (they would keep training)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields and fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass
class Tracked:
    """A process group leader we started: ``pid`` == its ``pgid``."""

    name: str
    pid: int
    started: int | None

    def to_dict(self) -> dict:
        return {"name": self.name, "pid": self.pid, "started": self.started}

    @classmethod
    def from_dict(cls, data: dict) -> Tracked:
        return cls(str(data["name"]), int(data["pid"]), data.get("started"))

    def same_process(self) -> bool:
        """The leader is still the process we started (or gone, with members maybe left)."""
        now = start_time(self.pid)
        return now is None or self.started is None or now == self.started


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_groups(groups: Iterable[Tracked], *, grace: float = 10.0) -> set[int]:
    """SIGTERM every group, wait up to ``grace`` s, SIGKILL what is left; returns survivors
    (empty when everything is gone)."""
    groups = [g for g in groups if g.same_process()]
    pgids = {g.pid for g in groups}
    members = pids_in_groups(pgids)
    escaped = descendants(members) - members  # e.g. torchrun workers (own sessions)
    for g in groups:
        signal_group(g.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids_in_groups(pgids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for g in groups:
        signal_group(g.pid, signal.SIGKILL)
    kill_pids(p for p in escaped if alive(p))
    deadline = time.monotonic() + 5
    while (pids_in_groups(pgids) or any(alive(p) for p in escaped)) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    reap(g.pid for g in groups)
    return pids_in_groups(pgids) | {p for p in escaped if alive(p)}


def reap(pids: Iterable[int]) -> None:
    """Collect exit statuses of our children so they do not linger as zombies."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_popen_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group led by ``proc``, SIGKILL what is left after ``grace``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def getpgid(pid: int) -> int | None:
    """The process group of ``pid``, or None if it is gone."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


# -- a job's share: found by the token in its processes' environment ---------------------------


def share_token(job_id: str, rank: int, address: str) -> str:
    """``DL_SHARE_TOKEN`` of a job's share on one node (the address keeps emulated nodes on
    one machine apart)."""
    return f"{job_id}/{rank}/{address}"


def pids_with_token(token: str) -> list[int]:
    """Processes whose environment carries ``DL_SHARE_TOKEN=<token>``.

    A process group is not enough: torchrun starts every worker in a NEW session, so when
    the agent is killed its workers would survive outside the share's group. Every
    descendant inherits the token (unless it clears its environment), whatever its group,
    session or parent is now."""
    needle = b"\0DL_SHARE_TOKEN=" + token.encode() + b"\0"
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if needle in b"\0" + data + b"\0":
            found.append(int(entry))
    return found


def signal_share(pgid: int, token: str, sig: int) -> None:
    """Signal the share's process group and every process carrying its token."""
    killpg(pgid, sig)
    for pid in pids_with_token(token):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def sweep_share(pgid: int, token: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL the share's group and every process carrying its token, again and again
    until none is left (or ``timeout``): a dying torchrun may still be starting workers
    when the first sweep runs, and its workers live in sessions of their own. Returns the
    PIDs still alive at the end (normally none)."""
    deadline = time.monotonic() + timeout
    while True:
        if pgid:
            killpg(pgid, signal.SIGKILL)
        left = [pid for pid in pids_with_token(token) if alive(pid)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)

"""Helpers of the agent benchmarks: when a process started, when a node applied a
generation, and when a set of processes has gone quiet.

Times are read from the kernel, not from polling: a process's start from ``/proc/<pid>/stat``
(clock ticks since boot, i.e. ``CLOCK_BOOTTIME`` at 10 ms resolution) and a node's apply from
the mtime of its local ``membership.json``, which the agent writes LAST when it applies a
generation (``bootstrap_scripts.agent.node_files``). The benchmark's own polling interval
therefore never enters a figure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from bootstrap_scripts.node.procgroup import start_time
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import MEMBERSHIP_FILE

TICKS = os.sysconf("SC_CLK_TCK")


def boot_clock() -> float:
    """Seconds since boot, the clock of ``/proc/<pid>/stat``'s start times."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def wall_to_boot(wall: float) -> float:
    """A wall-clock time (e.g. a file's mtime) on the boot clock."""
    return wall - (time.time() - boot_clock())


def process_started(pid: int) -> float:
    """When ``pid`` was forked, on the boot clock (10 ms resolution)."""
    ticks = start_time(pid)
    if ticks is None:
        raise AssertionError(f"process {pid} is gone")
    return ticks / TICKS


def applied_at(root: Path) -> float | None:
    """When the node at ``root`` last applied a generation (boot clock), None if never."""
    try:
        return wall_to_boot((root / MEMBERSHIP_FILE).stat().st_mtime_ns / 1e9)
    except FileNotFoundError:
        return None


def applied_generation(root: Path) -> int:
    return Membership.load(root / MEMBERSHIP_FILE).generation


def wait_applied(roots: Iterable[Path], *, after: float, timeout: float, what: str,
                 interval: float = 0.02) -> float:
    """Wait until every root applied a generation later than ``after`` (boot clock) and
    return the last apply time; AssertionError naming the laggards on timeout. One
    ``stat`` per node per round: cheap next to what the agents do."""
    roots = list(roots)
    deadline = time.monotonic() + timeout
    while True:
        stamps = [applied_at(r) for r in roots]
        late = [r for r, t in zip(roots, stamps, strict=True) if t is None or t <= after]
        if not late:
            return max(t for t in stamps if t is not None)
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; "
                                 f"{len(late)} not applied, e.g. {late[0]}")
        time.sleep(interval)


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds used so far by the live processes among ``pids``."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def rss_mib(pids: Iterable[int]) -> float:
    """Resident memory of the live processes among ``pids``, MiB."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1024


def wait_quiet(pids: Iterable[int], *, timeout: float = 50.0, window: float = 1.0) -> float:
    """Wait until ``pids`` together use under a quarter of the machine's CPUs over
    ``window`` (no interpreter is starting any more: what is left is their idle polling);
    returns the CPU share they used in the last window. Booting N nodes on a small machine
    queues their start-up work; the figures are about the protocol, so the measured node
    starts once the others are idle, as on AWS where each node has CPUs of its own."""
    pids = list(pids)
    limit = 0.25 * (os.cpu_count() or 1) * window
    deadline = time.monotonic() + timeout
    before = cpu_seconds(pids)
    while True:
        time.sleep(window)
        now = cpu_seconds(pids)
        if now - before < limit:
            return (now - before) / window
        if time.monotonic() >= deadline:
            raise AssertionError(f"{len(pids)} node processes still busy after {timeout:.0f}s "
                                 f"({now - before:.2f} CPU s in the last {window} s)")
        before = now


def cpu_shares(groups: dict[str, list[int]], *, window: float = 2.0) -> dict[str, float]:
    """The CPU share each group of processes uses over ``window`` seconds (idle nodes: which
    kind of process the machine's idle load is)."""
    before = {name: cpu_seconds(pids) for name, pids in groups.items()}
    time.sleep(window)
    return {name: (cpu_seconds(pids) - before[name]) / window
            for name, pids in groups.items()}

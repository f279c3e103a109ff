"""Is a node's job executor there? The one rule, for everyone who asks.

A job published to a node without a live executor would only fail after ``--start-timeout``;
checking the executors' heartbeats first fails in seconds and names every missing node. The
runner checks before it publishes (:func:`check_reachable`), the job controller before it
picks an attempt's nodes and while it waits for an orphan to stop, the health gate before
it sends a node its checks: all through :func:`unreachable`.
"""

from __future__ import annotations

import time
from pathlib import Path

from bootstrap_scripts.jobs.engine.outcomes import EXIT_UNREACHABLE, RunError
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat


def read_heartbeat(efs: Path, address: str) -> ExecutorHeartbeat | None:
    """The executor heartbeat of ``address``, None when missing or unreadable."""
    return store.read_record_or_none(ClusterPaths(efs).executor_heartbeat(address),
                                     ExecutorHeartbeat)


def executor_state(hb: ExecutorHeartbeat | None, timeout: float) -> str:
    """What is wrong with an executor, judged by its heartbeat ("" when nothing)."""
    if hb is None:
        return "no executor heartbeat"
    if hb.state == "stopped":
        return "executor stopped"
    age = time.time() - hb.heartbeat
    if age > timeout:
        return f"executor heartbeat {age:.0f} s old"
    return ""


def unreachable(efs: Path, addresses: list[str], timeout: float
                ) -> dict[str, tuple[str, ExecutorHeartbeat | None]]:
    """The addresses whose executor is missing, stopped or silent for ``timeout`` s, each
    with why and the heartbeat read (None: none)."""
    out = {}
    for addr in addresses:
        hb = read_heartbeat(efs, addr)
        why = executor_state(hb, timeout)
        if why:
            out[addr] = (why, hb)
    return out


def check_reachable(efs: Path, addresses: list[str], *, timeout: float,
                    reach_timeout: float) -> None:
    """Fail fast, naming every address whose executor is missing, stopped or stale. A
    heartbeat whose timestamp is old (or absent) gets ``reach_timeout`` s to move."""
    problems = {addr: (why, hb.seq if hb else None)
                for addr, (why, hb) in unreachable(efs, addresses, timeout).items()}
    deadline = time.monotonic() + reach_timeout
    while problems and time.monotonic() < deadline:
        time.sleep(0.2)
        for addr in list(problems):
            hb = read_heartbeat(efs, addr)
            if hb and hb.state != "stopped" and hb.seq != problems[addr][1]:
                del problems[addr]  # it moved: alive, whatever the clocks say
    if problems:
        detail = "; ".join(f"{a}: {s[0]}" for a, s in sorted(problems.items()))
        raise RunError(f"cannot reach node(s) {', '.join(sorted(problems))} ({detail}); "
                       f"is the job executor running there? (heartbeats under "
                       f"{ClusterPaths(efs).executors_dir})", EXIT_UNREACHABLE)

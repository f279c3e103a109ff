"""One torch elastic restart, phase by phase, from timestamped logs (pure: lines in, table
out; ``tests/chaos/test_restart_breakdown.py`` writes the lines, ``test_restart_phases.py``
unit-tests this).

Lines: ``AG <unix time> <node> <message>`` (a torchrun agent's log, ``jobs/timed_agent.py``)
and ``WK <unix time> rank=<R> <phase> cpu=<seconds>`` (the example's phases and the worker's
CPU time so far, ``jobs/timed_digits.py``). Each boundary is the LAST node's (the restart
is over when the slowest is done), except the round's opening and completion (one event
each) and rank 0's first step. ``worker_cpu`` gives the workers' own CPU seconds in each
start-up phase: on a shared machine the wall time of a phase also holds other processes'
work, its CPU time hardly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LINE = re.compile(r"^(AG|WK) (\d+\.\d+) (.*)$")

#: (phase, pattern, first or last occurrence), in the order a restart passes them.
BOUNDARIES = (
    ("next round opens (workers exited, a dead node expired)",
     r"added itself to the participants of round", "first"),
    ("last call, round complete", r"marked round \d+ of the rendezvous .* as complete", "first"),
    ("every agent starts its workers", r"Starting worker group", "last"),
    ("import torch", r"torch imported", "last"),
    ("init_process_group (gloo)", r"init_process_group done", "last"),
    ("the example's data", r"load_data done", "last"),
    ("model, optimizer, checkpoint loaded", r"load_checkpoint done", "last"),
    ("first step (rank 0)", r"rank=0 out first_step", "first"),
)
#: the worker's start-up phases by CPU time: (phase, the mark that ends it), in order; the
#: first starts at the process's start (0 s of CPU)
WORKER_PHASES = (
    ("import torch", r"torch imported"),
    ("init_process_group (gloo)", r"init_process_group done"),
    ("the example's data", r"load_data done"),
    ("model, optimizer, checkpoint loaded", r"load_checkpoint done"),
)
CPU = re.compile(r"^rank=(\S+) .* cpu=(\d+\.\d+)$")
#: within the first phase: every live agent's workers have exited (it is on the wait list)
EXITED = r"added itself to the wait list"


@dataclass(frozen=True)
class Event:
    at: float
    text: str


def events(lines: list[str]) -> list[Event]:
    out = []
    for line in lines:
        m = LINE.match(line.strip())
        if m:
            out.append(Event(float(m.group(2)), m.group(3)))
    return sorted(out, key=lambda e: e.at)


def _find(evs: list[Event], since: float, until: float, pattern: str, which: str) -> float | None:
    hits = [e.at for e in evs if since <= e.at < until and re.search(pattern, e.text)]
    if not hits:
        return None
    return hits[0] if which == "first" else hits[-1]


def phases(evs: list[Event], start: float, until: float = float("inf")) -> list[tuple[str, float]]:
    """Seconds spent in each phase from ``start`` (the kill, or the agents seeing a node
    waiting) to rank 0's first step; a missing boundary raises (the restart did not
    happen as expected). The first row is followed by its part spent on the workers' exit."""
    rows, previous = [], start
    for name, pattern, which in BOUNDARIES:
        at = _find(evs, previous, until, pattern, which)
        if at is None:
            raise ValueError(f"no {name!r} ({pattern}) after {previous:.3f}")
        rows.append((name, at - previous))
        if len(rows) == 1:
            exited = _find(evs, start, at, EXITED, "last")
            rows.append(("  of which: every live agent's workers exited",
                         (exited or start) - start))
        previous = at
    return rows


def total(rows: list[tuple[str, float]]) -> float:
    return sum(s for name, s in rows if not name.startswith("  "))


def seen_waiting(evs: list[Event], since: float) -> float:
    """When the first running agent saw the joining node waiting (the join restart's start)."""
    at = _find(evs, since, float("inf"), r"Detected \d+ new nodes", "first")
    if at is None:
        raise ValueError("no agent saw the new node")
    return at


def worker_cpu(evs: list[Event], since: float) -> list[tuple[str, float]]:
    """Each start-up phase's CPU seconds, the mean over the workers that started after
    ``since`` (each rank's first marks after it); a missing mark raises."""
    per_rank: dict[str, list[float]] = {}
    for k, (_name, pattern) in enumerate(WORKER_PHASES):
        for e in evs:
            m = CPU.match(e.text)
            if e.at >= since and m and re.search(pattern, e.text):
                marks = per_rank.setdefault(m.group(1), [])
                if len(marks) == k:  # the rank's first mark of this phase after `since`
                    marks.append(float(m.group(2)))
    if not per_rank or any(len(m) != len(WORKER_PHASES) for m in per_rank.values()):
        raise ValueError(f"a worker without every start-up mark after {since:.3f}: {per_rank}")
    rows = []
    for k, (name, _pattern) in enumerate(WORKER_PHASES):
        spent = [m[k] - (m[k - 1] if k else 0.0) for m in per_rank.values()]
        rows.append((name, sum(spent) / len(spent)))
    return rows

"""The torchft recovery bench's figures, from the replica processes' own event lines (pure:
no clock, no files; unit-tested by ``test_torchft_figures.py``).

Each process of ``jobs/torchft_replica.py`` writes JSON lines: ``start`` (before torch is
imported), ``ready`` (the Manager up), one ``step`` per attempted step (``step``: the
committed step count after it; ``committed``; ``world``: replicas that took part; ``healing``;
``quorum_s``/``commit_s``/``step_s``; ``checksum`` of the weights), ``done``. The harness
adds only its own doings: when it killed a replica (SIGKILL) and when it started the
replacement process. Definitions (printed as the bench's legend):

- **training again**: the fault (SIGKILL) -> the last survivor's first *committed* step
  after it (a step whose all-reduce failed is discarded, not committed). The goodput
  bench's "training again" is the fault -> the first step of the next generation of ranks:
  the same point (the first step that counts again), read from other records;
- **steps lost**: the highest step committed before the fault minus the step the survivors
  went on from (torchft never rolls back: 0 unless a commit was undone); **discarded**: the
  survivors' step attempts between the fault and training again (their time is the cost);
- **rejoined**: the replacement process's start by the harness -> its first committed step
  in which it took part at full size, through: its interpreter and torch's import
  (``start``/``ready``), the quorum that admitted it, the weights, optimizer state and step
  received from a live peer (``healing``), the first step it takes part in; **weights
  recovered** when its checksum at that step equals a survivor's at the same step; the
  survivors' longest step while it joined (what the join costs them: they never stop);
- **per-step overhead**: the medians, over fault-free steps at full size (each process's
  first :data:`WARMUP` steps left out), of the time waiting for the quorum and in
  ``should_commit``, and of the whole step against the same loop without torchft.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

WARMUP = 5

LEGEND = """\
training again: the SIGKILL -> the last survivor's first committed step after it (the
  goodput bench's "training again": the fault -> the first step of the next generation of
  ranks); discarded: survivors' step attempts not committed in between; steps lost: the
  highest committed step before the fault minus the step they went on from.
rejoined: the replacement process started -> its first committed step at full size
  (interpreter, torch's import, the Manager, the quorum that admits it, the state received
  from a live peer); weights equal: its weight checksum at that step is the survivors';
  the survivors' longest step while it joined (their only cost of the join)."""


@dataclass
class Recovery:
    again_s: float | None = None  # the fault -> the last survivor's first committed step
    discarded: int = 0  # survivors' step attempts not committed after the fault
    lost_steps: int | None = None
    rejoined_s: float | None = None  # replacement started -> its first full-size commit
    start_s: float | None = None  # replacement started -> its first line (interpreter)
    import_s: float | None = None  # its first line -> ready (torch, torchft, the Manager)
    healed: bool = False  # it received the state from a peer
    weights_recovered: bool | None = None
    #: the survivors' longest step (step delay excluded) while the replacement joined
    join_step_s: float | None = None


def steps(events: list[dict], *, pid: int | None = None, replica: int | None = None
          ) -> list[dict]:
    return sorted((e for e in events if e["event"] == "step"
                   and (pid is None or e["pid"] == pid)
                   and (replica is None or e["replica"] == replica)), key=lambda e: e["t"])


def first(events: list[dict], kind: str, pid: int) -> dict | None:
    return next((e for e in sorted(events, key=lambda e: e["t"])
                 if e["event"] == kind and e["pid"] == pid), None)


def recovery(events: list[dict], *, victim_pid: int, killed_at: float, full: int,
             spawned_at: float | None = None, replacement_pid: int | None = None
             ) -> Recovery:
    """One fault's figures (module docstring)."""
    r = Recovery()
    survivors = {e["pid"] for e in events if e["pid"] not in (victim_pid, replacement_pid)
                 and e["event"] == "step" and e["t"] <= killed_at}
    before = [e["step"] for e in steps(events) if e["committed"] and e["t"] <= killed_at]
    again = []
    for pid in survivors:
        after = [e for e in steps(events, pid=pid) if e["t"] > killed_at]
        ok = next((e for e in after if e["committed"]), None)
        if ok is None:
            return r  # a survivor never trained again
        again.append(ok)
        r.discarded += sum(1 for e in after if e["t"] < ok["t"] and not e["committed"])
    if again:
        last = max(again, key=lambda e: e["t"])
        r.again_s = last["t"] - killed_at
        if before:
            r.lost_steps = max(0, max(before) - (min(e["step"] for e in again) - 1))
    if replacement_pid is None or spawned_at is None:
        return r
    start, ready = first(events, "start", replacement_pid), first(events, "ready",
                                                                  replacement_pid)
    if start:
        r.start_s = start["t"] - spawned_at
    if start and ready:
        r.import_s = ready["t"] - start["t"]
    mine = steps(events, pid=replacement_pid)
    r.healed = any(e["healing"] for e in mine)
    joined = next((e for e in mine if e["committed"] and e["world"] >= full
                   and not e["healing"]), None)
    if joined is not None:
        r.rejoined_s = joined["t"] - spawned_at
        peers = [e for e in steps(events) if e["pid"] in survivors
                 and e["step"] == joined["step"] and e["committed"]]
        r.weights_recovered = bool(peers) and all(
            abs(e["checksum"] - joined["checksum"]) <= 1e-6 * max(1.0, abs(e["checksum"]))
            for e in peers)
        during = [e["step_s"] for e in steps(events) if e["pid"] in survivors
                  and spawned_at <= e["t"] <= joined["t"]]
        r.join_step_s = max(during, default=None)
    return r


@dataclass
class Overhead:
    quorum_s: float
    commit_s: float
    step_s: float
    steps: int


def overhead(events: list[dict], *, full: int, until: float | None = None) -> Overhead | None:
    """Medians over the fault-free full-size committed steps before ``until``, each
    process's first :data:`WARMUP` steps left out."""
    picked = []
    for pid in {e["pid"] for e in events}:
        mine = [e for e in steps(events, pid=pid) if until is None or e["t"] < until]
        picked += [e for e in mine[WARMUP:] if e["committed"] and e["world"] >= full]
    if not picked:
        return None
    return Overhead(statistics.median(e["quorum_s"] for e in picked),
                    statistics.median(e["commit_s"] for e in picked),
                    statistics.median(e["step_s"] for e in picked), len(picked))


def restart_again(events: list[dict], *, killed_at: float) -> float | None:
    """A full restart's "training again": the fault -> the first step of the processes
    started after it (every rank's, the last of them: the new generation trains)."""
    new = {e["pid"] for e in events if e["event"] == "start" and e["t"] > killed_at}
    firsts = [next((e for e in steps(events, pid=p)), None) for p in new]
    if not firsts or any(f is None for f in firsts):
        return None
    return max(f["t"] for f in firsts) - killed_at


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None

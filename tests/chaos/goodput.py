"""Goodput figures from the product's own records: what a fault schedule cost a job.

The goodput bench (``test_goodput.py``) samples, while the job runs, the records the product
writes anyway: every rank's progress file (``jobs/<id>.<n>/progress/<rank>.json``,
``RankProgress``: the step, the time the script reported it, the process, when that process
reported its first step, the last 16 step times) and the job controller's record
(``managed/<id>/job.json``: restarts, node losses, start and end). This module turns those
samples into the figures, pure (no clock, no files), so the arithmetic is tested on its own
(``test_goodput_figures.py``).

Definitions (the bench prints them as its legend; docs/runner.md repeats them):

- a **generation** is one set of training processes: the ranks whose first step was
  reported within :data:`SAME_GENERATION_S` of rank 0's (every torchrun restart, every new
  attempt, starts one); its **size** is how many ranks it has;
- a step's **time** is the time rank 0 reported for it (``recent_step_seconds``: since its
  previous step in the same process); a generation's first step has none (it includes the
  process's start-up) and counts as that generation's median step;
- **productive step time**: the sum, over the steps 1..N of the job's final history (a step
  redone after a restart counts once, in the generation that did it last), of their times;
- **wall time**: the job controller's record of the job, from its first attempt's start to
  its end (``job.json``: ``started_at`` -> ``finished_at``): the launch, every fault, the
  end; the training span (the start of the first step -> the last step, from the progress
  records) is printed too;
- the **fault-free ratio**: N x the job's step time before any fault (its first
  generation's median) / wall time, the same ratio without crediting a shrunken job's
  steps being faster here (fewer processes on 2 shared cores; on GPUs they are slower);
- **ETTR** (Effective Training Time Ratio) = productive step time / wall time: 1.0 when no
  second was lost to detection, waiting, restarts, redone steps or hangs;
- per fault, from its injection (the harness's clock: nothing in the product records a
  fault it has not seen): **detected** (the controller's record of it: the restart
  record's ``at``, a node loss's ``at``, the hang report's ``detected_at``), **training
  again** (the first generation started after it: its first step, and its size), **full
  size** (the first generation of the job's full size started after it), **work lost**
  (steps done before the fault that were done again: the highest step reached before the
  next generation minus the step that generation resumed from).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

#: ranks of one generation report their first step together (their first all-reduce)
SAME_GENERATION_S = 3.0
#: the window of step times a progress record carries (``progress.RECENT``)
RECENT = 16


@dataclass(frozen=True)
class Sample:
    """One progress record as read: attempt ``n``, rank, process, its first report."""

    attempt: int
    rank: int
    pid: int
    started_at: float
    step: int
    time: float
    recent: tuple[float, ...] = ()


@dataclass
class Generation:
    attempt: int
    pid: int  # rank 0's process
    started_at: float  # rank 0's first step
    first_step: int
    last_step: int
    last_time: float
    size: int
    seconds: dict[int, float] = field(default_factory=dict)  # step -> its time

    @property
    def median(self) -> float:
        return statistics.median(self.seconds.values()) if self.seconds else 0.0


def generations(samples: Iterable[Sample]) -> list[Generation]:
    """Rank 0's processes in the order they started, each with its steps and size."""
    samples = list(samples)
    gens: dict[tuple[int, int], Generation] = {}
    for s in sorted((s for s in samples if s.rank == 0), key=lambda s: (s.started_at, s.time)):
        key = (s.attempt, s.pid)
        g = gens.get(key)
        known = min(len(s.recent), s.step - 1)
        first = s.step - known if len(s.recent) < RECENT else s.step - RECENT
        if g is None:
            g = gens[key] = Generation(s.attempt, s.pid, s.started_at, first, s.step, s.time, 0)
        g.first_step = min(g.first_step, first)
        if s.step >= g.last_step:
            g.last_step, g.last_time = s.step, max(g.last_time, s.time)
        for k in range(known):
            g.seconds[s.step - k] = s.recent[-1 - k]
    for g in gens.values():
        g.seconds.pop(g.first_step, None)  # its time is the process's start-up
        g.size = len({(s.rank, s.pid) for s in samples if s.attempt == g.attempt and
                      abs(s.started_at - g.started_at) <= SAME_GENERATION_S})
    return sorted(gens.values(), key=lambda g: g.started_at)


def productive_seconds(gens: list[Generation]) -> tuple[float, int]:
    """(productive step time, steps in the final history)."""
    owner: dict[int, Generation] = {}
    for g in gens:  # later generations redo (own) the steps they repeated
        for step in range(g.first_step, g.last_step + 1):
            owner[step] = g
    total = sum(g.seconds.get(step, g.median) for step, g in owner.items())
    return total, len(owner)


@dataclass
class FaultFigures:
    what: str
    at: float
    detected_s: float | None = None
    again_s: float | None = None
    again_size: int = 0
    full_s: float | None = None
    lost_steps: int | None = None
    note: str = ""


def fault_figures(what: str, at: float, gens: list[Generation], *, full_size: int,
                  detected_at: float | None, note: str = "") -> FaultFigures:
    """One fault's figures (module docstring), ``detected_at`` from the controller's
    record of it (None: it recorded nothing)."""
    f = FaultFigures(what, at, note=note)
    if detected_at is not None:
        f.detected_s = round(detected_at - at, 1)
    before = [g for g in gens if g.started_at <= at]
    after = [g for g in gens if g.started_at > at]
    if after:
        f.again_s, f.again_size = round(after[0].started_at - at, 1), after[0].size
        full = next((g for g in after if g.size >= full_size), None)
        f.full_s = round(full.started_at - at, 1) if full else None
        if before:
            f.lost_steps = max(0, max(g.last_step for g in before) - (after[0].first_step - 1))
    return f


@dataclass
class RunFigures:
    policy: str
    faults: list[FaultFigures]
    productive_s: float
    training_s: float  # the start of the first step -> the last step (progress records)
    steps: int
    job_wall_s: float | None  # the job record's started_at -> finished_at
    #: the job's step time before any fault (its first generation's median, full size)
    reference_s: float = 0.0
    #: where the wall time went (:func:`wall_breakdown`): launch, between generations, end
    launch_s: float | None = None
    between_s: float = 0.0
    end_s: float | None = None
    #: lines printed under the run's summary (the complete breakdown, ``goodput_breakdown``)
    detail: list[str] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return self.job_wall_s if self.job_wall_s is not None else self.training_s

    @property
    def ettr(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def fault_free_ratio(self) -> float:
        """N steps at the fault-free step time / wall time."""
        return self.steps * self.reference_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def training_ettr(self) -> float:
        return self.productive_s / self.training_s if self.training_s > 0 else 0.0


def between_generations(gens: list[Generation]) -> float:
    """Seconds no generation trained: from each generation's last step to the start of the
    next one's first step (its first report less its median step), summed: detection,
    restarts, a hang's timeout, waiting for a replacement, the processes' start-up."""
    total, last = 0.0, None
    for g in gens:
        start = g.started_at - g.median
        if last is not None:
            total += max(0.0, start - last)
        last = g.last_time if last is None else max(last, g.last_time)
    return total


def run_figures(policy: str, samples: Iterable[Sample], faults: list[tuple[str, float,
                float | None, str]], *, full_size: int,
                job_span: tuple[float | None, float | None] = (None, None)) -> RunFigures:
    """Every figure of one run; ``faults``: (what, injected at, detected at, note)."""
    gens = generations(samples)
    productive, steps = productive_seconds(gens)
    # from the start of the first step: its report, less one step (its time is unknown)
    wall = (max(g.last_time for g in gens) - gens[0].started_at + gens[0].median) if gens \
        else 0.0
    start, end = job_span
    return RunFigures(policy, [fault_figures(w, at, gens, full_size=full_size, detected_at=d,
                                             note=n) for w, at, d, n in faults],
                      productive, wall, steps,
                      (end - start) if start is not None and end is not None else None,
                      gens[0].median if gens else 0.0,
                      launch_s=(gens[0].started_at - gens[0].median - start)
                      if gens and start is not None else None,
                      between_s=between_generations(gens),
                      end_s=(end - max(g.last_time for g in gens))
                      if gens and end is not None else None)


LEGEND = """\
ETTR (Effective Training Time Ratio) = productive step time / wall time.
  productive step time: the sum over steps 1..N of the job's final history of the time rank 0
    reported for each step (its progress records' recent_step_seconds); a step redone after a
    restart counts once (its last run); a process's first step (start-up) counts as its
    generation's median step.
  wall time: the job's record, its first attempt's start -> its end (launch and end
    included); the training span (start of the first step -> last step, progress records)
    and the ETTR over it are printed too, and N x the fault-free step time (the first
    generation's median) / wall time, which does not count the faster steps of fewer
    processes sharing this machine's 2 cores as work.
per fault, from its injection: detected = the controller's record (restart 'at', node loss
  'at', hang report 'detected_at'); training again = first step of the first new generation
  of ranks (and its size); full size = the first new generation at the job's full size;
  work lost = steps reached before the fault that were done again."""


def report(runs: list[RunFigures], *, full_size: int) -> str:
    """The printed figures: one table per run, then each later run's ETTR against the
    first's (the waiting policy's)."""
    out = [LEGEND, ""]
    for r in runs:
        out.append(f"{r.policy}: {r.steps} steps, productive {r.productive_s:.1f} s of "
                   f"{r.wall_s:.1f} s wall -> ETTR {r.ettr:.3f} (training span "
                   f"{r.training_s:.1f} s -> {r.training_ettr:.3f}); {r.steps} x the "
                   f"fault-free {r.reference_s:.3f} s/step = {r.steps * r.reference_s:.1f} s "
                   f"-> {r.fault_free_ratio:.3f}")
        out.append(f"  where the wall time went: launch {_s(r.launch_s)} (the job's start to "
                   f"its first step), between generations {r.between_s:.1f} s (detection, "
                   f"restarts, hang timeout, waiting), end {_s(r.end_s)}, steps "
                   f"{r.training_s - r.between_s:.1f} s (productive {r.productive_s:.1f} s)")
        out += r.detail
        out.append(f"  {'fault':34} {'detected':>9} {'training again':>18} "
                   f"{'full size':>10} {'work lost':>10}")
        for f in r.faults:
            again = (f"{f.again_s:.1f} s on {f.again_size}" if f.again_s is not None
                     else "-")
            out.append(f"  {f.what:34} {_s(f.detected_s):>9} {again:>18} {_s(f.full_s):>10} "
                       f"{'-' if f.lost_steps is None else str(f.lost_steps) + ' steps':>10}"
                       + (f"  ({f.note})" if f.note else ""))
    for r in runs[1:] if runs and runs[0].ettr > 0 else ():
        out.append(f"ETTR {r.policy} / {runs[0].policy} = "
                   f"{r.ettr / runs[0].ettr:.2f}x (goal >= 1.5x; ETTR goal >= 0.9; "
                   f"full size {full_size} nodes)")
    return "\n".join(out)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"

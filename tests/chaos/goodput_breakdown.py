"""Where a goodput run's wall time went, every second of it, and what the measured
per-fault costs would make of a realistic fault rate (pure: no clock, no files).

The goodput bench (``test_goodput.py``) hands this module what ``goodput.py`` read from the
product's records (the generations of ranks, the job's span), what the harness knows of its
own doing (when it injected each fault, when each replacement registered) and the attempts'
start times (``job.json``'s ``usage``). :func:`breakdown` cuts the job's wall time into rows
that add up to it exactly:

- **launch**: the job's start to the start of its first step (the runner, the shares,
  torchrun, torch's import in every process, the rendezvous, the data);
- **steps kept**: the productive step time (the ETTR's numerator; a checkpoint's stall in
  the loop is inside it, and so is a straggler's slowness);
- **steps redone**: the time of the steps a later generation did again (work lost since the
  last checkpoint);
- **idle**, one row per stretch with no generation training (a *gap*: one generation's last
  step to the start of the next one's first), named by what caused it: the fault injected
  in it (or during the generation before it), else a replacement's registration (an elastic
  job restarts every worker when the replacement joins), else "other";
- **end**: the last step to the job's end (the exit barrier, the last save, the controller);
- **unattributed**: what is left (generations that overlap, step times between samples).

Each gap also carries its events (the controller's record of the fault, a replacement's
registration, an attempt's start), in seconds from the gap's start, so a row says where its
time went inside.

:func:`projection` is a *computed projection*, never a measurement: the measured cost of
each fault (its idle rows and redone steps) with the replacement's real boot put back in
place of the scaled one, spread over a job of ``work_h`` hours at one fault every
``mtbf_h`` hours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tests.chaos.goodput import Generation

JOINED = "replacement joined (workers restarted to grow)"


@dataclass
class Gap:
    start: float  # the previous generation's last step
    end: float  # the start of the next generation's first step
    cause: str
    fault: int | None = None  # index into the faults, the replacement's loss for a join
    events: list[tuple[str, float]] = field(default_factory=list)  # (what, at)

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def waited(self) -> bool:
        """A replacement registered after this stretch's fault was injected: the job waited
        for it. One that registered before (in a spare run, the previous loss's replacement,
        seen in the same window) was not waited for."""
        injected = [t for what, t in self.events if what == "fault injected"]
        since = injected[0] if injected else self.start
        return any(what == "replacement registered" and t >= since for what, t in self.events)


def gaps(gens: list[Generation], faults: list[tuple[str, float, float | None]], *,
         registrations: list[float] = (), attempts: list[tuple[int, float]] = ()
         ) -> list[Gap]:
    """Every stretch without training, named (module docstring); ``faults``: (what,
    injected at, the controller's record of it or None); ``attempts``: (n, started at)."""
    out: list[Gap] = []
    claimed: set[int] = set()
    last_loss: int | None = None
    last_end: float | None = None
    prev_start: float | None = None
    for g in gens:
        start = g.started_at - g.median
        if last_end is not None and prev_start is not None and start > last_end:
            window = [k for k, (_w, at, _d) in enumerate(faults)
                      if prev_start <= at <= start and k not in claimed]
            regs = [t for t in registrations if prev_start <= t <= start]
            gap = Gap(last_end, start, "other")
            if window:
                k = window[-1]
                claimed.update(window)
                what, at, detected = faults[k]
                gap.cause, gap.fault = f"{what} #{k + 1}", k
                gap.events.append(("fault injected", at))
                if detected is not None and detected <= start:
                    gap.events.append(("controller's record", detected))
                if what == "worker killed":
                    last_loss = k
            elif regs:
                gap.cause, gap.fault = JOINED, last_loss
            gap.events += [("replacement registered", t) for t in regs]
            gap.events += [(f"attempt {n} started", t) for n, t in attempts
                           if last_end < t <= start]
            gap.events.sort(key=lambda e: e[1])
            out.append(gap)
        last_end = g.last_time if last_end is None else max(last_end, g.last_time)
        prev_start = start
    return out


def redone_seconds(gens: list[Generation]) -> float:
    """The time of the steps each generation did that a later one did again."""
    owner: dict[int, Generation] = {}
    for g in gens:
        for step in range(g.first_step, g.last_step + 1):
            owner[step] = g
    return sum(g.seconds.get(step, g.median) for g in gens
               for step in range(g.first_step, g.last_step + 1) if owner[step] is not g)


@dataclass
class Breakdown:
    rows: list[tuple[str, float]]  # add up to wall_s
    wall_s: float
    gaps: list[Gap]
    redone_s: float

    def fault_cost(self, k: int) -> float:
        """Idle seconds that fault ``k`` caused (its own gap and its replacement's join)."""
        return sum(g.seconds for g in self.gaps if g.fault == k)


def breakdown(gens: list[Generation], faults: list[tuple[str, float, float | None]], *,
              productive_s: float, job_span: tuple[float, float],
              registrations: list[float] = (), attempts: list[tuple[int, float]] = ()
              ) -> Breakdown:
    """The wall time's rows (module docstring), adding up to ``job_span``'s length."""
    start, end = job_span
    wall = end - start
    found = gaps(gens, faults, registrations=registrations, attempts=attempts)
    redone = redone_seconds(gens)
    rows = [("launch: job start -> first step", gens[0].started_at - gens[0].median - start)
            if gens else ("launch: job start -> first step", 0.0),
            ("steps kept (productive step time)", productive_s),
            ("steps redone (work lost since a checkpoint)", redone)]
    rows += [(f"idle {n}: {g.cause}", g.seconds) for n, g in enumerate(found, 1)]
    rows.append(("end: last step -> job end", end - max(g.last_time for g in gens)
                 if gens else 0.0))
    rows.append(("unattributed (overlapping generations, sampling)",
                 wall - sum(s for _n, s in rows)))
    return Breakdown(rows, wall, found, redone)


def lines(b: Breakdown) -> list[str]:
    """The printed breakdown: each row with its share of the wall time, each gap's events."""
    out = []
    for name, s in b.rows:
        out.append(f"    {name:52} {s:7.1f} s {100 * s / b.wall_s if b.wall_s else 0:5.1f} %")
    out.append(f"    {'total (the job record: start -> end)':52} "
               f"{sum(s for _n, s in b.rows):7.1f} s = wall {b.wall_s:.1f} s")
    for n, g in enumerate(b.gaps, 1):
        marks = ", ".join(f"{what} {at - g.start:+.1f}" for what, at in g.events)
        out.append(f"    idle {n}, from the last step: {marks}, "
                   f"first step again {g.seconds:+.1f}")
    return out


@dataclass(frozen=True)
class Projection:
    mtbf_h: float
    ettr: float


def projected_fault_cost(b: Breakdown, kinds: list[str], *, shrunk_s: dict[int, float],
                         full_size: int, shrunk_size: int, boot_scaled: float,
                         boot_real: float, waited: dict[int, bool], step_s: float,
                         lost_steps: dict[int, int]) -> list[float]:
    """Each fault's cost with the real boot: its idle seconds, its redone steps, plus
    ``boot_real - boot_scaled`` where the job waited for the replacement (``waited``), plus,
    for an elastic job that trained on ``shrunk_size`` of ``full_size`` nodes for
    ``shrunk_s[k]`` s (the scaled boot included), the work those missing nodes would have
    done (on GPUs with a fixed global batch a smaller world's steps are slower)."""
    out = []
    for k, _what in enumerate(kinds):
        cost = b.fault_cost(k) + lost_steps.get(k, 0) * step_s
        if waited.get(k):
            cost += boot_real - boot_scaled
        if k in shrunk_s:
            cost += (1 - shrunk_size / full_size) * (shrunk_s[k] - boot_scaled + boot_real)
        out.append(cost)
    return out


def projection(costs: list[float], *, launch_end_s: float, work_h: float,
               mtbfs_h: tuple[float, ...]) -> list[Projection]:
    """ETTR of ``work_h`` hours of fault-free work with one fault every ``mtbf_h`` hours of
    it, each costing the mean of ``costs`` (the schedule's mix), plus the launch and end."""
    mean = sum(costs) / len(costs) if costs else 0.0
    work = work_h * 3600
    return [Projection(m, work / (work + launch_end_s + work_h / m * mean)) for m in mtbfs_h]


_SUMMARY = re.compile(r"checkpoints mode=(\w+) saves=(\d+) blocked_ms_per_save=([\d.]+)")


def checkpoint_stall(log_lines: list[str]) -> tuple[float, int, int]:
    """(seconds the step loops spent inside saves, saves, summary lines) from rank 0's
    summary lines (``checkpoints mode=... saves=N blocked_ms_per_save=X``): one per process
    that ended by returning or by SIGTERM; one killed outright prints none."""
    total, saves, found = 0.0, 0, 0
    for line in log_lines:
        m = _SUMMARY.search(line)
        if m:
            n = int(m.group(2))
            total += n * float(m.group(3)) / 1000
            saves += n
            found += 1
    return total, saves, found


def goal_rates(waiting: list[float], elastic: list[float], *, ettr: float = 0.9,
               ratio: float = 1.5) -> tuple[float | None, float | None, float | None]:
    """For a long job (launch and end negligible) with faults of the schedule's mix, each
    costing the mean of its policy's ``costs``: (the shortest fault interval, in seconds of
    work, at which the elastic ETTR is still ``ettr``; the longest at which the elastic
    ETTR is still ``ratio`` x the waiting one; the elastic ETTR there). None where no
    interval does it. ETTR = 1 / (1 + c / T) for one fault every T seconds of work."""
    if not waiting or not elastic:
        return None, None, None
    cw, ce = sum(waiting) / len(waiting), sum(elastic) / len(elastic)
    for_ettr = ce / (1 / ettr - 1) if ce > 0 else None
    if cw <= ratio * ce:
        return for_ettr, None, None  # the ratio never reaches it: c_w / c_e is its limit
    t = (cw - ratio * ce) / (ratio - 1)
    return for_ettr, t, 1 / (1 + ce / t)


def in_place_schedule(b: Breakdown, kinds: list[str], *, productive_s: float, step_s: float,
                      lost_steps: dict[int, int], again_s: float, join_s: float
                      ) -> tuple[float, float]:
    """A computed projection, never a measurement: (wall time, ETTR) of the measured run had
    each worker loss cost ``again_s`` (the survivors' pause with recovery in place: torchft's,
    measured by its own bench) and its replacement's join ``join_s`` (the survivors' longest
    step meanwhile) instead of its measured idle stretches and redone steps. The other
    faults, the launch, the end and the steps kept stay as measured."""
    wall = b.wall_s
    for k, what in enumerate(kinds):
        if what == "worker killed":
            wall += again_s + join_s - b.fault_cost(k) - lost_steps.get(k, 0) * step_s
    return wall, productive_s / wall if wall > 0 else 0.0


def in_place_fault_cost(kinds: list[str], measured: list[float], *, again_s: float,
                        join_s: float, rejoin_s: float, boot_real: float, full_size: int,
                        shrunk_size: int, spare: bool = False) -> list[float]:
    """Each fault's cost at the real boot with recovery in place (a computed projection):
    a worker loss costs the survivors' pause and the join, plus the missing node's share of
    the time on ``shrunk_size`` nodes until the replacement (booted, ``boot_real``) has
    rejoined (``rejoin_s``: its start, import and the state from a peer) -- or nothing more
    with a ``spare`` replica group already in the quorum, which takes the lost one's place;
    any other fault keeps its ``measured`` cost (same order as ``kinds``)."""
    share = 0.0 if spare else (1 - shrunk_size / full_size) * (boot_real + rejoin_s)
    return [again_s + join_s + share if what == "worker killed" else cost
            for what, cost in zip(kinds, measured, strict=True)]

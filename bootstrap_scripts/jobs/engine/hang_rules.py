"""Hangs and stragglers of a managed job: pure decisions, no I/O, tested as tables.

The job controller (``controller/hangs.py``) reads every rank's progress file
(``jobs/<id>.<n>/progress/<rank>.json``, written by ``bootstrap_scripts.progress``) while an
attempt runs, notes on its own clock when each rank's step last moved, and asks:

- :func:`judge_hang`: has no rank made progress for ``--hang-timeout`` seconds? Only once
  some rank has reported at all: a script that never reports (or is still loading its
  data) is never called hung. After an elastic membership change no hang is judged for
  ``RESTART_GRACE_FACTOR`` timeouts, and the clock starts at the new processes' first
  report.
- :func:`odd_ranks`: once the stacks are dumped, which ranks are not where the others are
  (a lower step, or another stack than the majority's; with no majority, the ranks that
  are not waiting in a collective while others are).
- :func:`stragglers`: which ranks' step time stays above ``k`` times the median of the
  others' for ``m`` steps in a row (shown by ``dl-jobs``; never a restart), compared on the
  ranks' own compute times when every rank reports them (:func:`comparable_step_times`).
- :func:`watchdog_env`: torch's own watchdog settings for a job with a hang timeout, set
  so that torch's fires only after the controller had its chance to dump the stacks.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

#: A rank is a straggler when its last ``STRAGGLER_STEPS`` step times are all above
#: ``STRAGGLER_FACTOR`` times the median of the other ranks' latest.
STRAGGLER_FACTOR = 1.5
STRAGGLER_STEPS = 5
#: Functions (py-spy's frame names) and files of a rank waiting for its peers.
COLLECTIVE_FUNCTIONS = frozenset({
    "all_reduce", "allreduce", "barrier", "monitored_barrier", "broadcast", "all_gather",
    "all_gather_into_tensor", "all_gather_object", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "gather", "scatter", "reduce", "send", "recv", "wait",
    "_engine_run_backward", "synchronize"})
COLLECTIVE_FILES = ("distributed_c10d.py",)
#: The cancel file's first words when the controller stops an attempt as hung
#: (``controller/hangs.py``), and that stop's SIGTERM -> SIGKILL delay (:func:`stop_grace`).
HANG_CANCEL_PREFIX = "hang: "
HANG_STOP_GRACE = 1.0
#: After an elastic membership change no hang is judged for this many hang timeouts: the
#: workers' restart (or two: a loss, then the replacement's join) is not a hang.
RESTART_GRACE_FACTOR = 3
#: torch's flight recorder: events kept per process group.
FLIGHT_RECORDER_EVENTS = 2000


@dataclass(frozen=True)
class Hang:
    """No rank moved for ``seconds`` (>= the timeout); ``behind``: ranks below the top step
    or that never reported."""

    seconds: float
    last_progress_at: float
    top_step: int
    behind: tuple[int, ...]


def judge_hang(steps: Mapping[int, int | None], moved_at: Mapping[int, float], *,
               now: float, timeout: float, ranks: int = 0,
               restarted_at: float | None = None) -> Hang | None:
    """``steps``: each rank's last step (None: not reported); ``moved_at``: when (on the
    caller's clock) each reporting rank's step last changed; ``ranks``: how many ranks the
    attempt has (0: those in ``steps``). A hang once the newest move is ``timeout`` old.
    ``restarted_at``: when the attempt's processes were last replaced (an elastic
    membership change): for :data:`RESTART_GRACE_FACTOR` timeouts after it no hang is
    judged (the new processes' start-up: imports, rendezvous, the checkpoint's load; and
    torchrun may restart them once more as the next node joins, which the controller
    cannot see); then the usual rule, and new processes that never reported are a hang
    (they reported before, so they can)."""
    if timeout <= 0:
        return None
    if restarted_at is not None and now - restarted_at < RESTART_GRACE_FACTOR * timeout:
        return None  # torchrun may restart the workers again (a loss, then a join)
    if not moved_at:
        if restarted_at is None:
            return None
        everyone = range(max(ranks, max(steps, default=-1) + 1))
        return Hang(seconds=now - restarted_at, last_progress_at=restarted_at, top_step=0,
                    behind=tuple(everyone))
    last = max(moved_at.values())
    if now - last < timeout:
        return None
    known = [s for s in steps.values() if s is not None]
    top = max(known) if known else 0
    everyone = range(max(ranks, max(steps, default=-1) + 1))
    behind = tuple(r for r in everyone if steps.get(r) is None or steps[r] < top)
    return Hang(seconds=now - last, last_progress_at=last, top_step=top, behind=behind)


def in_collective(signature: str) -> bool:
    """Does this stack signature (``file:function;...``, innermost first) wait for peers?"""
    for frame in signature.split(";"):
        file, _sep, func = frame.rpartition(":")
        if func in COLLECTIVE_FUNCTIONS or file.endswith(COLLECTIVE_FILES):
            return True
    return False


def odd_ranks(steps: Mapping[int, int | None], signatures: Mapping[int, str]) -> tuple[int, ...]:
    """The ranks that are not where the others are: a step below the top one (or none),
    or a stack other than the one most ranks share; when no stack is shared by more ranks
    than any other, the ranks outside a collective while others wait in one. Empty when
    every rank is at the same place (a collective that never returns anywhere: the health
    gate, not the stacks, tells which node is at fault)."""
    ranks = sorted(set(steps) | set(signatures))
    known = [s for s in steps.values() if s is not None]
    top = max(known) if known else None
    odd = {r for r in ranks if top is not None and (steps.get(r) is None or steps[r] < top)}
    sigs = {r: s for r, s in signatures.items() if s}
    counts = Counter(sigs.values()).most_common()
    if len(counts) > 1:
        (best, n), (_second, n2) = counts[0], counts[1]
        if n >= 2 and n > n2:
            odd |= {r for r, s in sigs.items() if s != best}
        else:
            waiting = {r for r, s in sigs.items() if in_collective(s)}
            if waiting and len(waiting) < len(sigs):
                odd |= set(sigs) - waiting
    return tuple(sorted(odd))


def stack_signature(frames: list[tuple[str, str]]) -> str:
    """``file:function;...`` of (file, function) frames, innermost first: what two ranks'
    stacks are compared on (no line numbers: two ranks in one function are in one place)."""
    return ";".join(f"{file}:{func}" for file, func in frames)


@dataclass(frozen=True)
class Straggler:
    rank: int
    step_seconds: float  # its median over the last ``m`` steps
    reference: float  # the median of the other ranks' latest step times
    ratio: float


def comparable_step_times(times: Mapping[int, tuple[tuple[float, ...], tuple[float, ...]]]
                          ) -> dict[int, tuple[float, ...]]:
    """What the straggler rule compares, from each rank's (step times, own compute times):
    the compute times when every rank gives them (the all-reduce makes step times equal,
    so only a rank's own time shows it lags), else the step times (one kind for all: a
    rank's compute time is always below the others' step times)."""
    if times and all(compute for _step, compute in times.values()):
        return {r: compute for r, (_step, compute) in times.items()}
    return {r: step for r, (step, _compute) in times.items()}


def stragglers(recent: Mapping[int, tuple[float, ...]], *, factor: float = STRAGGLER_FACTOR,
               steps: int = STRAGGLER_STEPS) -> tuple[Straggler, ...]:
    """Ranks whose last ``steps`` step times all exceed ``factor`` x the median of the
    other ranks' latest step time (``recent``: each rank's step times, oldest first)."""
    latest = {r: ts[-1] for r, ts in recent.items() if ts}
    found = []
    for r, ts in sorted(recent.items()):
        others = [t for o, t in latest.items() if o != r]
        if len(ts) < steps or not others:
            continue
        ref = statistics.median(others)
        window = ts[-steps:]
        if ref > 0 and all(t > factor * ref for t in window):
            mine = statistics.median(window)
            found.append(Straggler(rank=r, step_seconds=mine, reference=ref,
                                   ratio=mine / ref))
    return tuple(found)


def collective_timeout(hang_timeout: float) -> float:
    """torch's collective timeout for a job with this hang timeout: long enough that the
    controller (which judges after ``hang_timeout`` and then dumps stacks) acts first, and
    torch's watchdog stays the backstop when nothing else does."""
    return 2 * hang_timeout + 60


def watchdog_env(hang_timeout: float, flight_prefix: str) -> dict[str, str]:
    """The ranks' torch watchdog settings (docs/managed-jobs.md, "Hangs and stragglers"); none
    when the job has no hang timeout. ``flight_prefix``: the flight recorder's file prefix
    (torch appends the rank)."""
    if hang_timeout <= 0:
        return {}
    timeout = collective_timeout(hang_timeout)
    return {
        "DL_COLLECTIVE_TIMEOUT": f"{timeout:g}",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": f"{timeout + 60:g}",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_RECORDER_EVENTS),
        "TORCH_FR_BUFFER_SIZE": str(FLIGHT_RECORDER_EVENTS),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": flight_prefix,
        "TORCH_FR_DUMP_TEMP_FILE": flight_prefix,
    }


def stop_grace(grace: float, cancel_text: str) -> float:
    """The SIGTERM -> SIGKILL delay of a share being stopped: the job's ``--grace``, at most
    :data:`HANG_STOP_GRACE` when the controller stopped the attempt as hung (its cancel
    file says ``hang: ...``). The grace is the job's chance to finish its step and save;
    a hung attempt made no progress on any rank for the whole hang timeout, after its
    stacks were dumped, and its ranks wait inside a collective (or a sleep) where a
    SIGTERM handler of theirs does not run, so the full grace would only be waited out (5 s
    by default, on every hang restart)."""
    if cancel_text.startswith(HANG_CANCEL_PREFIX):
        return min(grace, HANG_STOP_GRACE)
    return grace

"""The example's side of hang detection: its progress each step, torch's collective timeout.

Kept apart from ``train_digits.py`` so that the training loop gains two calls, not a page:

    tracker = train_progress.Tracker()
    dist.init_process_group(backend=backend, timeout=train_progress.collective_timeout())
    net = DDP(model); tracker.attach(net)
    ...
    tracker.step(global_step, loss_per_sample, samples_this_step_over_all_ranks)

``Tracker.step`` declares the step through ``bootstrap_scripts.progress`` (a no-op outside a
managed job) with the samples per second since the previous step and the rank's OWN time
for the step (``compute_seconds``): its time since the previous step less its wait in the
gradient all-reduce. Why not the wall-clock time: the all-reduce makes every rank wait for
the slowest, so wall-clock step times are equal on every rank and a straggler cannot be told
from the ranks waiting for it; its own time is what stands out (the controller's straggler
rule compares them). ``attach`` times the all-reduce with a DDP communication hook that runs
DDP's own all-reduce (``allreduce_hook``: the same sum divided by the world size).
``collective_timeout``
is ``$DL_COLLECTIVE_TIMEOUT`` seconds, which the job controller sets (longer than the job's
``--hang-timeout``) so that torch's own watchdog stays the backstop behind the controller's;
None (torch's default) without it. torch reads no variable for that timeout: a script
passes it to ``init_process_group`` itself.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable

from bootstrap_scripts import progress

TIMEOUT_ENV = "DL_COLLECTIVE_TIMEOUT"


def collective_timeout() -> datetime.timedelta | None:
    """torch's collective timeout for this job, None for torch's default."""
    try:
        seconds = float(os.environ.get(TIMEOUT_ENV, "") or 0)
    except ValueError:
        return None
    return datetime.timedelta(seconds=seconds) if seconds > 0 else None


class Tracker:
    """Declares each optimizer step, with the throughput since the previous one and the
    rank's own time for it (the time since the previous step less the all-reduce wait)."""

    def __init__(self, clock: object = time.perf_counter,
                 report: Callable[..., object] = progress.report) -> None:
        self.clock, self.report = clock, report  # report: where the step goes (tests: a file)
        self.last: float | None = None
        #: (first bucket handed to the all-reduce, last bucket reduced) in this step
        self.waiting: tuple[float, float] | None = None

    def now(self) -> float:
        return float(self.clock())  # type: ignore[operator]

    def attach(self, net: object) -> None:
        """Time ``net``'s gradient all-reduce (a DDP model; without ``register_comm_hook``,
        a single process, there is nothing to wait for and nothing to time)."""
        register = getattr(net, "register_comm_hook", None)
        if register is None:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state, bucket):  # no annotations: DDP checks them and these would be strings
            entered = self.now()

            def reduced(fut: object) -> object:
                self.waited(entered, self.now())
                return fut.value()  # type: ignore[attr-defined]

            return default_hooks.allreduce_hook(state, bucket).then(reduced)  # type: ignore[arg-type]

        register(None, hook)

    def waited(self, entered: float, reduced: float) -> None:
        """A bucket's all-reduce, from handing it over to its result: buckets in flight
        together are one wait (the span from the first handed over to the last reduced)."""
        if self.waiting is None:
            self.waiting = (entered, reduced)
        else:
            self.waiting = (min(self.waiting[0], entered), max(self.waiting[1], reduced))

    def step(self, global_step: int, loss: float, samples: int) -> None:
        now = self.now()
        wall = now - self.last if self.last is not None and now > self.last else None
        wait = self.waiting[1] - self.waiting[0] if self.waiting else 0.0
        self.last, self.waiting = now, None
        self.report(global_step, loss=loss, samples_per_s=samples / wall if wall else None,
                    compute_seconds=None if wall is None else max(0.0, wall - wait))

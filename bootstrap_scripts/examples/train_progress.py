"""The example's side of hang detection: its progress each step, torch's collective timeout.

Kept apart from ``train_digits.py`` so that the training loop gains two calls, not a page:

    tracker = train_progress.Tracker()
    dist.init_process_group(backend=backend, timeout=train_progress.collective_timeout())
    ...
    tracker.step(global_step, loss_per_sample, samples_this_step_over_all_ranks)

``Tracker.step`` declares the step through ``bootstrap_scripts.progress`` (a no-op outside a
managed job) with the samples per second since the previous step. ``collective_timeout``
is ``$DL_COLLECTIVE_TIMEOUT`` seconds, which the job controller sets (longer than the job's
``--hang-timeout``) so that torch's own watchdog stays the backstop behind the controller's;
None (torch's default) without it. torch reads no variable for that timeout: a script
passes it to ``init_process_group`` itself.
"""

from __future__ import annotations

import datetime
import os
import time

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
    """Declares each optimizer step, with the throughput since the previous one."""

    def __init__(self, clock: object = time.perf_counter) -> None:
        self.clock = clock
        self.last: float | None = None

    def step(self, global_step: int, loss: float, samples: int) -> None:
        now = float(self.clock())  # type: ignore[operator]
        rate = samples / (now - self.last) if self.last is not None and now > self.last else None
        self.last = now
        progress.report(global_step, loss=loss, samples_per_s=rate)

"""Declare a training script's progress, so the job controller can tell a hang from a slow job.

    from bootstrap_scripts import progress
    for step, batch in enumerate(loader, start=1):
        loss = train_step(batch)
        progress.report(step, loss=loss.item(), samples_per_s=rate)

Each rank writes its own file, ``$DL_PROGRESS_DIR/<rank>.json`` (a
:class:`~bootstrap_scripts.protocol.records.RankProgress`), atomically (temp file + rename),
at most once per ``$DL_PROGRESS_INTERVAL`` seconds (default 1): a step every few
milliseconds costs a dictionary update, not a write to EFS. A step reported within the
interval is written when it ends, by a timer thread: the file always catches up with the
last step within the interval, even when the rank hangs right after it (the step a hung
rank reached is what names it); a script that ends within the interval writes it at exit
(``atexit``: the timer is a daemon thread, gone with the interpreter), so a short job's
file holds its last step and step time, not its first. A managed job's ranks find
``DL_PROGRESS_DIR`` set to their attempt's ``jobs/<id>.<n>/progress/``; without it (a script
run by hand) :func:`report` does nothing, so the same script runs anywhere.

Why a file and not a socket: the controller, ``dl-jobs`` and a metrics emitter all read
the same record from EFS whenever they like, and a rank that hangs simply stops
rewriting it. A script that cannot import this module writes the same JSON itself (the
fields of ``RankProgress``; ``rank``, ``step`` and ``time`` are required) to
``$DL_PROGRESS_DIR/$RANK.json`` through a rename.

Only the standard library and this package's protocol modules: importable from any script
on a node (``PYTHONPATH`` has this package in every managed job).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.records import RankProgress

DIR_ENV = "DL_PROGRESS_DIR"
INTERVAL_ENV = "DL_PROGRESS_INTERVAL"
#: torch's flight recorder file prefix (``hang_rules.watchdog_env``)
FLIGHT_ENV = "TORCH_FR_DUMP_TEMP_FILE"
DEFAULT_INTERVAL = 1.0
#: How many of the last step times a record carries (the straggler rule looks at a few).
RECENT = 16
#: Where a launcher puts the rank: torchrun, Open MPI, MPICH/Intel MPI.
RANK_ENVS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_ENVS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name, "")
        if value.strip().lstrip("-").isdigit():
            return int(value)
    return default


class Reporter:
    """One process's progress: the last reported step and time, its recent step times."""

    def __init__(self, directory: str | os.PathLike, rank: int, *, local_rank: int = -1,
                 interval: float = DEFAULT_INTERVAL,
                 clock: object = time.time, catch_up: bool = True,
                 monotonic: object = None) -> None:
        self.path = Path(directory) / f"{int(rank)}.json"
        self.rank, self.local_rank, self.interval = int(rank), local_rank, interval
        self.clock = clock
        #: durations (step times, the write interval) on a clock no wall-clock jump moves
        #: (NTP, a VM resumed): the record's ``time`` stays the wall clock's, which other
        #: nodes read. A test's own ``clock`` serves both.
        self.monotonic = monotonic or (time.monotonic if clock is time.time else clock)
        self.last_mono = 0.0
        self.host = socket.gethostname()
        self.started_at = 0.0
        self.last_step: int | None = None
        self.last_time = 0.0
        self.written_at = float("-inf")
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.compute: deque[float] = deque(maxlen=RECENT)
        self.catch_up = catch_up
        self.lock = threading.Lock()
        self.pending: RankProgress | None = None
        self.timer: threading.Timer | None = None

    def report(self, step: int, *, loss: float | None = None,
               samples_per_s: float | None = None,
               step_seconds: float | None = None,
               compute_seconds: float | None = None) -> bool:
        """Note ``step`` done now; write the file if the interval has passed (True then).
        ``step_seconds``: this step's time; default: the time since the previous report
        over the steps taken since. ``compute_seconds``: this rank's own time for the step,
        without its wait for the others in the gradient all-reduce (the straggler rule
        compares these when every rank gives them); default: none."""
        with self.lock:
            now = float(self.clock())  # type: ignore[operator]
            mono = float(self.monotonic())  # type: ignore[operator]
            if not self.started_at:
                self.started_at = now
            if step_seconds is None and self.last_step is not None and step > self.last_step:
                step_seconds = (mono - self.last_mono) / (step - self.last_step)
            if step_seconds is not None:
                self.recent.append(round(float(step_seconds), 6))
            if compute_seconds is not None:
                self.compute.append(round(float(compute_seconds), 6))
            self.last_step, self.last_time, self.last_mono = int(step), now, mono
            rec = RankProgress(
                rank=self.rank, step=int(step), time=now, pid=os.getpid(), host=self.host,
                local_rank=self.local_rank, started_at=self.started_at,
                loss=None if loss is None else float(loss),
                samples_per_s=None if samples_per_s is None else float(samples_per_s),
                step_seconds=self.recent[-1] if self.recent else None,
                recent_step_seconds=tuple(self.recent),
                recent_compute_seconds=tuple(self.compute))
            wait = self.interval - (mono - self.written_at)
            if wait <= 0:
                self.write(rec, mono)
                return True
            self.pending = rec
            if self.catch_up and self.timer is None:
                self.timer = threading.Timer(wait, self.flush)
                self.timer.daemon = True  # never keeps a finished script alive
                self.timer.start()
            return False

    def write(self, rec: RankProgress, now: float) -> None:
        """Write ``rec`` (the caller holds the lock)."""
        self.pending = None
        self.written_at = now
        # No fsync: a lost last record costs a second of staleness, an fsync per write on
        # EFS costs every step; the rename still makes every reader see a whole record.
        store.atomic_write(self.path, rec.to_json(), fsync=False)

    def flush(self) -> None:
        """Write the step reported within the last interval, if any (the timer's job)."""
        with self.lock:
            self.timer = None
            if self.pending is not None:
                with contextlib.suppress(OSError):
                    self.write(self.pending, float(self.monotonic()))  # type: ignore[operator]


_reporter: Reporter | None = None
_configured = False


def reporter() -> Reporter | None:
    """This process's :class:`Reporter`, from the environment (None outside a managed job)."""
    global _reporter, _configured
    if not _configured:
        _configured = True
        directory = os.environ.get(DIR_ENV, "")
        if directory:
            try:
                interval = float(os.environ.get(INTERVAL_ENV, "") or DEFAULT_INTERVAL)
            except ValueError:
                interval = DEFAULT_INTERVAL
            _reporter = Reporter(directory, _env_int(RANK_ENVS, 0),
                                 local_rank=_env_int(LOCAL_RANK_ENVS, -1),
                                 interval=max(0.0, interval))
            atexit.register(_reporter.flush)  # the last step, if the timer did not run yet
            flight = os.environ.get(FLIGHT_ENV, "")
            if flight:  # torch writes its flight recorder there but makes no directory
                with contextlib.suppress(OSError):
                    Path(flight).parent.mkdir(parents=True, exist_ok=True)
    return _reporter


def flush() -> None:
    """Write the last step reported within the interval now, as the ``atexit`` hook does at
    an ordinary exit: for a script that ends with ``os._exit`` (no ``atexit``), so its file
    still holds its last step. Nothing outside a managed job, or before a first report."""
    if _reporter is not None:
        _reporter.flush()


def report(step: int, loss: float | None = None, samples_per_s: float | None = None, *,
           step_seconds: float | None = None, compute_seconds: float | None = None) -> None:
    """Declare that this rank finished optimizer step ``step`` (any increasing count).
    Never raises on a write failure (a full disk must not stop training): progress is
    advisory; the worst case is a hang judged later."""
    rep = reporter()
    if rep is None:
        return
    with contextlib.suppress(OSError):
        rep.report(step, loss=loss, samples_per_s=samples_per_s, step_seconds=step_seconds,
                   compute_seconds=compute_seconds)

"""TensorBoard scalars of a training script, in its job's own directory on EFS.

    from bootstrap_scripts import tensorboard_log
    board = tensorboard_log.open_writer()          # None unless rank 0 has a directory
    ...
    tensorboard_log.scalars(board, step, loss=0.12, step_time_s=0.004)
    tensorboard_log.close(board)

A managed job's ranks find ``DL_TENSORBOARD_DIR`` set to ``managed/<job-id>/tensorboard/``
(the job controller sets it, one directory for every attempt, so a restarted job's curves
go on in the same place); ``dl-jobs tensorboard JOB`` (``dlc tensorboard JOB`` from a
laptop) serves that directory. The files are written by the rank itself, so as the job's
user, into the user's own job directory: nothing on the node writes them as root.

Only rank 0 writes (every rank computes the same global loss in a data-parallel job; one
writer keeps one event stream). The writer is ``torch.utils.tensorboard.SummaryWriter``,
which needs the ``tensorboard`` package (the nodes install it, constructs_lib/user_data.py);
without it, or without a directory, :func:`open_writer` says so once and returns None and
every call here does nothing, so the same script runs anywhere.
"""

from __future__ import annotations

import contextlib
import os
import sys

DIR_ENV = "DL_TENSORBOARD_DIR"
#: How often the writer flushes its events to the file (seconds): TensorBoard on the
#: master sees a running job's new points within this plus its own reload interval.
FLUSH_SECONDS = 5


def _rank() -> int:
    value = os.environ.get("RANK", "0")
    return int(value) if value.isdigit() else 0


def open_writer(directory: str = "") -> object | None:
    """Rank 0's SummaryWriter on ``directory`` (default ``$DL_TENSORBOARD_DIR``), or None
    (another rank, no directory, or no ``tensorboard`` package: said once on stderr)."""
    directory = directory or os.environ.get(DIR_ENV, "")
    if not directory or _rank() != 0:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch without tensorboard: train anyway, say why
        print(f"tensorboard: not writing scalars to {directory} ({exc})", file=sys.stderr,
              flush=True)
        return None
    os.makedirs(directory, mode=0o755, exist_ok=True)
    return SummaryWriter(log_dir=directory, flush_secs=FLUSH_SECONDS)


def scalars(writer: object | None, step: int, **values: float | None) -> None:
    """One point of each named scalar at ``step`` (None values are skipped)."""
    if writer is None:
        return
    for tag, value in values.items():
        if value is not None:
            writer.add_scalar(tag, float(value), int(step))  # type: ignore[attr-defined]


def close(writer: object | None) -> None:
    """Flush and close (the last points reach the file even on a quick exit)."""
    if writer is not None:
        with contextlib.suppress(OSError):
            writer.close()  # type: ignore[attr-defined]

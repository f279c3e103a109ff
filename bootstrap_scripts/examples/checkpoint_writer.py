"""The example job's checkpoints off the training loop's critical path.

A save costs the loop only an in-memory copy of the state: :meth:`CheckpointWriter.save`
copies every tensor of the state to CPU memory (``snapshot``: into the previous copy once
that is written), hands that copy to ONE background writer thread and returns; the thread
writes it with ``checkpoints.save_checkpoint``, unchanged (data file by temp + rename, then
the manifest last, then ``latest.json``, then the ``keep`` rotation). So a checkpoint is
still complete exactly when its manifest lists it, and a resume still takes the newest
complete one.

Why not ``torch.distributed.checkpoint.async_save``: it writes a directory of shards plus a
``.metadata`` file that ``FileSystemReader`` loads with ``pickle.load``, so resuming would run
code from a file on disk, which this example never does (``weights_only=True`` only). It is
also a collective (every rank takes part unless ``no_dist``) while here rank 0 alone saves,
and its directory is not the one-file checkpoint that the manifest and the S3 mirror describe.
The part of it this job needs (its default stager copies the state to CPU memory, then
``save`` runs in a thread) is what this module does.

Rules, and why:

- **At most one save in flight.** A new save first waits for the previous one. Skipping
  instead would silently widen the gap between restart points (an epoch-end checkpoint,
  the one a resume at an epoch boundary needs, could be the one skipped); waiting keeps
  "a restart loses at most ``--checkpoint-every`` steps" true, and the wait is counted and
  reported (``waited_for_previous`` in the summary line): a loop that waits often is
  checkpointing more often than its storage can write, and should raise the interval.
  It also bounds memory: one CPU copy of the state, reused from save to save.
- **Nothing is lost at the end.** :meth:`close` (and leaving the ``with`` block, however it
  is left: the last epoch, a SIGTERM drain, a lost peer's exception) waits for the save in
  flight; the job exits only after its last checkpoint is complete. The thread is not a
  daemon, so even an unforeseen exit path does not cut a write short.
- **An error in the writer fails the job.** It is raised as :class:`CheckpointWriteError`
  at the next save or at :meth:`close`, whichever comes first. When the job is already
  failing for another reason, leaving the ``with`` block prints the writer's error on stderr
  and lets the first error through.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.examples import checkpoints


class CheckpointWriteError(RuntimeError):
    """A checkpoint the loop handed over was not written: the job must not go on as if it had
    a restart point."""


def snapshot(obj: object, spare: object = None) -> object:
    """A copy of a state dict that later training steps cannot change: every tensor copied to
    CPU memory, every dict, list and tuple rebuilt; other values (numbers, strings, None) are
    immutable and shared. ``spare``, a previous snapshot no longer in use, lends its tensors
    where shape and dtype match: copying into memory already mapped costs the loop a memcpy,
    not a fresh allocation's page faults (what DCP's caching stager does too)."""
    import torch

    if isinstance(obj, torch.Tensor):
        if isinstance(spare, torch.Tensor) and spare.shape == obj.shape and \
                spare.dtype == obj.dtype:
            return spare.copy_(obj.detach())
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        old = spare if isinstance(spare, dict) else {}
        return {k: snapshot(v, old.get(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        olds = spare if isinstance(spare, (list, tuple)) and len(spare) == len(obj) else ()
        return type(obj)(snapshot(v, olds[i] if olds else None) for i, v in enumerate(obj))
    return obj


@dataclass
class SaveStats:
    """What checkpointing cost, for the job's summary line and ``make bench``."""

    saves: int = 0
    blocked_s: float = 0.0  # the loop's time inside save(): waiting for the previous + copy
    write_s: float = 0.0  # the writer's time: torch.save, manifest, latest.json, rotation
    waited: int = 0  # saves that found the previous one still being written


class CheckpointWriter:
    """Rank 0's checkpoint saver: asynchronous (one background writer), or synchronous
    (``asynchronous=False``: written in the loop, as before; kept for comparison)."""

    def __init__(self, ckdir: Path, keep: int, *, asynchronous: bool = True,
                 local: Path | None = None) -> None:
        """``local``: a node-local directory written first (``checkpoints.save_checkpoint``)."""
        self.ckdir, self.keep, self.asynchronous = ckdir, keep, asynchronous
        self.local = local
        self.stats = SaveStats()
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: tuple[str, Future, object] | None = None  # name, write, its copy
        self._spare: object = None  # the last written copy: the next one's memory

    def save(self, state: dict, name: str) -> None:
        """Checkpoint ``state`` (live tensors) as ``name``. Returns once the state is copied;
        raises :class:`CheckpointWriteError` if the previous save failed."""
        start = time.perf_counter()
        if not self.asynchronous:
            self._write(state, name)
        else:
            if self._inflight and not self._inflight[1].done():
                self.stats.waited += 1
            self.wait()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="checkpoint-writer")
            staged = snapshot(state, self._spare)
            self._spare = None  # in use until written
            self._inflight = (name, self._pool.submit(self._write, staged, name), staged)
        self.stats.saves += 1
        self.stats.blocked_s += time.perf_counter() - start

    def _write(self, state: dict, name: str) -> Path:
        start = time.perf_counter()
        path = checkpoints.save_checkpoint(self.ckdir, state, name, self.keep, self.local)
        self.stats.write_s += time.perf_counter() - start  # only the writer adds to it
        return path

    def wait(self) -> None:
        """Wait for the save in flight; raise :class:`CheckpointWriteError` if it failed."""
        if self._inflight is None:
            return
        name, future, staged = self._inflight
        self._inflight = None
        exc = future.exception()
        if exc is None:
            self._spare = staged
        else:
            raise CheckpointWriteError(
                f"checkpoint {name} in {self.ckdir} was not written: "
                f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Wait for the save in flight (raising its error), then stop the writer thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            self._spare = None

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # already failing: still finish the save in flight, never hide either error
            self.close()
        except CheckpointWriteError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)

    def summary(self, loop_s: float) -> str:
        """One machine-parsable line: what checkpointing cost the loop and the writer."""
        s, n = self.stats, max(1, self.stats.saves)
        return (f"checkpoints mode={'async' if self.asynchronous else 'sync'} saves={s.saves} "
                f"blocked_ms_per_save={s.blocked_s / n * 1000:.1f} "
                f"write_ms_per_save={s.write_s / n * 1000:.1f} "
                f"waited_for_previous={s.waited} loop_s={loop_s:.3f}")

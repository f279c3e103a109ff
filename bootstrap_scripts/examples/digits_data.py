"""The example's data: scikit-learn's digits, split the same way on every rank, and each
rank's share of every global batch at any world size (``train_digits.py``'s "World-size
policy": step k of an epoch means the same samples whatever the world size).

Kept apart from ``train_digits.py`` so the training script stays the loop and its
checkpoints; these functions need numpy and torch (scikit-learn for the first start only),
imported when called.

The split is cached in the job's checkpoint directory (``digits-split-<key>.npz``, numpy
arrays only): a restart (elastic or the controller's) loads it with numpy instead of
importing scikit-learn again, which cost each worker 1.0-1.3 s of CPU on every restart, a
third of its start (1.6-4.4 s of wall time with 3-4 workers on 2 cores: docs/runner.md,
"The worker's start, examined phase by phase"). The key is a hash of what decides the split
(the seed, the test fraction, the digits' source: scikit-learn's copy, or the bytes of
``--data-dir``'s ``digits.npz``), so a cache is never used for another split; the cached
arrays are the split the first start computed, for as long as the directory lives. The
file is written whole (temp file + rename) and read only when it is this user's own regular
file (no link) holding arrays of the expected shapes and types (``allow_pickle=False``: no
object is ever unpickled); anything else is ignored with a message, the split computed again
and the cache rewritten. A directory that cannot be written only costs the cache.

Writing a cache file removes the directory's other ``digits-split-*.npz`` (another seed,
fraction or source: a split the job no longer uses), so a directory reused across runs
keeps one; only this user's own regular files are removed, looked at without following a
link (``lstat`` relative to the directory opened once), so a link or another user's file
planted there is left alone. Two jobs with different splits sharing one directory would
each remove the other's: that costs only the cache (computed again).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
import sys
import zipfile
from pathlib import Path

from bootstrap_scripts.examples.checkpoints import UntrustedCheckpoint, atomic_write, open_own

#: the cached arrays, in ``load_data``'s order
SPLIT_KEYS = ("x_train", "x_test", "y_train", "y_test")
#: pixels per image (8 x 8)
FEATURES = 64
#: the names :func:`cache_name` gives (the only files :func:`prune_splits` may remove)
CACHE_NAME_RE = re.compile(r"digits-split-[0-9a-f]{16}\.npz")


def load_data(seed: int, test_fraction: float, data_dir: str = "",
              cache_dir: Path | None = None):
    """The fixed split every rank computes identically (same seed, no communication):
    ``x_train, x_test, y_train, y_test``; from ``cache_dir``'s cache when it holds this
    split, else computed (scikit-learn) and cached there (module doc)."""
    source = Path(data_dir) / "digits.npz" if data_dir else None
    raw = source.read_bytes() if source else b""
    name = cache_name(seed, test_fraction, raw)
    split = read_split(cache_dir, name) if cache_dir is not None else None
    if split is None:
        split = compute_split(seed, test_fraction, raw)
        if cache_dir is not None:
            write_split(cache_dir, name, split)
    if source:
        print(f"data: {source} ({len(split[2]) + len(split[3])} samples)", flush=True)
    return split


def cache_name(seed: int, test_fraction: float, raw: bytes) -> str:
    """The cache file of this split: the seed, the fraction and the source decide it."""
    digest = hashlib.sha256(f"{seed}:{test_fraction!r}:".encode())
    digest.update(raw if raw else b"scikit-learn digits")
    return f"digits-split-{digest.hexdigest()[:16]}.npz"


def compute_split(seed: int, test_fraction: float, raw: bytes = b""):
    """The split from scikit-learn's digits, or from ``raw`` (a ``digits.npz``: arrays x, y)."""
    import io

    import numpy as np
    from sklearn.model_selection import train_test_split

    if raw:
        with np.load(io.BytesIO(raw), allow_pickle=False) as f:
            x, y = f["x"], f["y"]
    else:
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)  # pixel values are 0..16
    return tuple(train_test_split(x, y.astype(np.int64), test_size=test_fraction,
                                  random_state=seed, stratify=y))


def read_split(cache_dir: Path, name: str):
    """The cached split, or None: none yet, or not one this job wrote (then it says why)."""
    import numpy as np

    try:
        fd = open_own(cache_dir, name)
    except FileNotFoundError:
        return None
    except (UntrustedCheckpoint, OSError) as exc:
        print(f"ignoring the cached digits: {exc}", file=sys.stderr, flush=True)
        return None
    try:
        with open(fd, "rb") as fh, np.load(fh, allow_pickle=False) as f:
            split = tuple(f[k] for k in SPLIT_KEYS)
        x_train, x_test, y_train, y_test = split
        ok = all(x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == FEATURES
                 for x in (x_train, x_test)) and \
            all(y.dtype == np.int64 and y.ndim == 1 for y in (y_train, y_test)) and \
            len(x_train) == len(y_train) > 0 and len(x_test) == len(y_test) > 0
        if not ok:
            raise ValueError("not the arrays of a split")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        print(f"ignoring the cached digits {cache_dir / name}: {exc}", file=sys.stderr,
              flush=True)
        return None
    return split


def write_split(cache_dir: Path, name: str, split) -> None:
    """Cache ``split`` as ``cache_dir/name``, whole or not at all (temp file + rename)."""
    import numpy as np

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:  # a file object: np.savez would add ".npz" to a name
            np.savez(fh, **dict(zip(SPLIT_KEYS, split, strict=True)))

    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(cache_dir / name, write)
    except OSError as exc:
        print(f"not caching the digits in {cache_dir}: {exc}", file=sys.stderr, flush=True)
        return
    prune_splits(cache_dir, name)


def prune_splits(cache_dir: Path, keep: str) -> list[str]:
    """Remove ``cache_dir``'s split caches other than ``keep`` that are this user's own
    regular files (never through a link: each entry is ``lstat``-ed and unlinked relative
    to the directory's descriptor, and unlink removes a link itself, not what it names).
    Returns the names removed; a failure only leaves a file behind (said once)."""
    removed: list[str] = []
    try:
        dfd = os.open(cache_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        print(f"not pruning the cached digits in {cache_dir}: {exc}", file=sys.stderr,
              flush=True)
        return removed
    try:
        for entry in sorted(os.listdir(dfd)):
            if entry == keep or not CACHE_NAME_RE.fullmatch(entry):
                continue
            try:
                st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    continue
                os.unlink(entry, dir_fd=dfd)
            except FileNotFoundError:
                continue  # another rank removed it first
            except OSError as exc:
                print(f"not removing the cached digits {cache_dir / entry}: {exc}",
                      file=sys.stderr, flush=True)
                continue
            removed.append(entry)
    except OSError as exc:
        print(f"not pruning the cached digits in {cache_dir}: {exc}", file=sys.stderr,
              flush=True)
    finally:
        os.close(dfd)
    return removed


def steps_per_epoch(n: int, global_batch: int) -> int:
    return math.ceil(n / global_batch)


def rank_slice(count: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s part of ``count`` samples: sizes differ by at most one, earlier ranks
    take the remainder (64 over 3 ranks: 22, 21, 21). Works for any world size."""
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def epoch_batches(n: int, seed: int, epoch: int, global_batch: int, rank: int, world: int,
                  start_step: int = 0):
    """This rank's sample indices for each step of ``epoch`` from ``start_step`` on, with the
    size of the global batch: ``[(indices, global_count), ...]``. The permutation depends on
    the seed and epoch only, so step k means the same samples at every world size."""
    import torch

    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g)
    out = []
    for step in range(start_step, steps_per_epoch(n, global_batch)):
        chunk = perm[step * global_batch:(step + 1) * global_batch]
        lo, hi = rank_slice(len(chunk), rank, world)
        out.append((chunk[lo:hi], len(chunk)))
    return out

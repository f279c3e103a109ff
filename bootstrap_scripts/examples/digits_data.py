"""The example's data: scikit-learn's digits, split the same way on every rank, and each
rank's share of every global batch at any world size (``train_digits.py``'s "World-size
policy": step k of an epoch means the same samples whatever the world size).

Kept apart from ``train_digits.py`` so the training script stays the loop and its
checkpoints; these functions need numpy, torch and scikit-learn, imported when called.
"""

from __future__ import annotations

import math
from pathlib import Path


def load_data(seed: int, test_fraction: float, data_dir: str = ""):
    """The fixed split every rank computes identically (same seed, no communication)."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if data_dir:
        with np.load(Path(data_dir) / "digits.npz") as f:
            x, y = f["x"], f["y"]
        print(f"data: {Path(data_dir) / 'digits.npz'} ({len(y)} samples)", flush=True)
    else:
        x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)  # pixel values are 0..16
    return train_test_split(x, y.astype(np.int64), test_size=test_fraction, random_state=seed,
                            stratify=y)


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

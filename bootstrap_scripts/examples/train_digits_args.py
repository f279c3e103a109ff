"""The example's command line (``train_digits.py``'s flags) and where its checkpoints go.

Kept apart from ``train_digits.py`` so the training script a user copies stays the loop;
``train_digits`` re-exports both functions.
"""

from __future__ import annotations

import argparse
import os
import pwd
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, checked (an error exits with argparse's usage message)."""
    p = argparse.ArgumentParser(description="DDP example on scikit-learn's digits")
    p.add_argument("--epochs", type=int, default=20, help="total epochs (default: 20)")
    p.add_argument("--global-batch-size", type=int, default=64,
                   help="samples per optimizer step over ALL ranks, any world size "
                   "(default: 64)")
    p.add_argument("--lr", type=float, default=3e-3,
                   help="peak Adam learning rate, cosine-decayed per epoch (default: 3e-3)")
    p.add_argument("--hidden", type=int, default=128, help="hidden units (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="split / init / shuffle seed")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--name", default="digits", help="checkpoint sub-directory name")
    p.add_argument("--checkpoint-dir", default="", help="default: $DL_CHECKPOINT_DIR (a managed "
                   "job's), else $EFS_MOUNT/checkpoints/<name> (./checkpoints/<name> without "
                   "EFS_MOUNT)")
    p.add_argument("--checkpoint-every", type=int, default=10,
                   help="step checkpoint every N optimizer steps; 0: epoch ends only "
                   "(default: 10)")
    p.add_argument("--sync-checkpoints", action="store_true",
                   help="write each checkpoint inside the step loop instead of in the "
                   "background (to measure what the background writer saves)")
    p.add_argument("--keep", type=int, default=3, help="checkpoints of each kind to keep "
                   "(default: 3)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint, whichever run wrote it "
                   "(implied by DL_RESUME=1: a managed job's restart)")
    p.add_argument("--require-acc", type=float, default=0.0,
                   help="exit 1 if the final held-out accuracy is below this")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="sleep this long after each step (demos: stretch the short job so "
                   "nodes can join and leave while it runs; default: 0)")
    p.add_argument("--data-dir", default=os.environ.get("DL_DATA_DIR", ""),
                   help="read the digits from DIR/digits.npz (arrays x, y), e.g. what "
                   "dl-run --data staged on the node (default: $DL_DATA_DIR, else "
                   "scikit-learn's own copy); the split is cached in the checkpoint "
                   "directory for restarts")
    p.add_argument("--stop-file", default="",
                   help="end the run at the next epoch boundary once this file exists, even "
                   "before --epochs (every rank agrees; the learning-rate schedule still "
                   "spans --epochs): train until something else is done (default: off)")
    p.add_argument("--tensorboard-dir", default="",
                   help="rank 0 writes TensorBoard scalars (loss, accuracy, step_time_s) "
                   "here (default: $DL_TENSORBOARD_DIR, a managed job's own; none without)")
    ns = p.parse_args(argv)
    if ns.global_batch_size < 1:
        p.error(f"--global-batch-size must be >= 1, got {ns.global_batch_size}")
    if ns.epochs < 1:
        p.error(f"--epochs must be >= 1, got {ns.epochs}")
    if ns.checkpoint_every < 0:
        p.error(f"--checkpoint-every must be >= 0, got {ns.checkpoint_every}")
    return ns


def checkpoint_dir(args: argparse.Namespace) -> Path:
    """``--checkpoint-dir``, else a managed job's ``DL_CHECKPOINT_DIR``, else the user's own
    directory under ``$EFS_MOUNT/checkpoints`` (the current directory without EFS)."""
    if args.checkpoint_dir:
        return Path(args.checkpoint_dir)
    if os.environ.get("DL_CHECKPOINT_DIR"):
        return Path(os.environ["DL_CHECKPOINT_DIR"])
    base = os.environ.get("EFS_MOUNT") or "."
    return Path(base) / "checkpoints" / pwd.getpwuid(os.geteuid()).pw_name / args.name

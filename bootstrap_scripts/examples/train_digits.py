"""Example job: PyTorch DDP on scikit-learn's digits (ships with scikit-learn: no download).

    dl-run -- -m bootstrap_scripts.examples.train_digits            # every node, torchrun
    dl-run -- -m bootstrap_scripts.examples.train_digits --resume   # continue from EFS

The first thing to run on a new cluster: it exercises the rendezvous, the collective
backend (gloo on CPU, nccl on GPU), EFS checkpoints and resume, in about 20 s on CPUs.

Rank 0 prints one line per epoch, readable and machine-parsable::

    epoch=3 acc=0.962 loss=0.1234 samples_per_s=12345 world_size=2 lr=0.002 global_batch=64

World-size policy (why resume stays correct when the cluster grows or shrinks): the GLOBAL
batch size and the learning rate are fixed; each rank takes ``global_batch // world_size``
samples per step. The optimisation is then the same maths at any world size, so a
checkpoint (model + optimizer state + epoch) taken with 4 ranks resumes unchanged with 2.
The data order per epoch comes from DistributedSampler(seed, epoch), so it is reproducible.
Checkpoints go to ``<EFS>/checkpoints/<name>/epoch-<N>.pt`` (rank 0, temp file + rename)
with ``latest.json`` pointing at the newest; ``--resume`` starts after it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DDP example on scikit-learn's digits")
    p.add_argument("--epochs", type=int, default=20, help="total epochs (default: 20)")
    p.add_argument("--global-batch-size", type=int, default=64,
                   help="samples per optimizer step over ALL ranks (default: 64)")
    p.add_argument("--lr", type=float, default=3e-3,
                   help="peak Adam learning rate, cosine-decayed (default: 3e-3)")
    p.add_argument("--hidden", type=int, default=128, help="hidden units (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="split / init / shuffle seed")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--name", default="digits", help="checkpoint sub-directory name")
    p.add_argument("--checkpoint-dir", default="", help="default: $EFS_MOUNT/checkpoints/<name>"
                   " (./checkpoints/<name> without EFS_MOUNT)")
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep (default: 3)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--require-acc", type=float, default=0.0,
                   help="exit 1 if the final held-out accuracy is below this")
    return p.parse_args(argv)


def epoch_lr(base: float, epoch: int, epochs: int) -> float:
    """Cosine decay to zero over ``epochs``: a function of the epoch alone, so a resumed run
    (any world size) continues on exactly the same schedule."""
    return base * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / max(1, epochs)))


def checkpoint_dir(args: argparse.Namespace) -> Path:
    if args.checkpoint_dir:
        return Path(args.checkpoint_dir)
    base = os.environ.get("EFS_MOUNT") or "."
    return Path(base) / "checkpoints" / args.name


def load_data(seed: int, test_fraction: float):
    """The fixed split every rank computes identically (same seed, no communication)."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)  # pixel values are 0..16
    return train_test_split(x, y.astype(np.int64), test_size=test_fraction, random_state=seed,
                            stratify=y)


def save_checkpoint(ckdir: Path, state: dict, epoch: int, keep: int) -> Path:
    import torch

    ckdir.mkdir(parents=True, exist_ok=True)
    final = ckdir / f"epoch-{epoch:04d}.pt"
    fd, tmp = tempfile.mkstemp(dir=ckdir, prefix=".epoch-", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fd, tmp = tempfile.mkstemp(dir=ckdir, prefix=".latest-", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump({"epoch": epoch, "file": final.name}, fh)
    os.replace(tmp, ckdir / "latest.json")
    for old in sorted(ckdir.glob("epoch-*.pt"))[:-keep]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    return final


def latest_checkpoint(ckdir: Path) -> Path | None:
    try:
        name = json.loads((ckdir / "latest.json").read_text())["file"]
    except (OSError, ValueError, KeyError):
        return None
    path = ckdir / name
    return path if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    distributed = "WORLD_SIZE" in os.environ
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if distributed:
        dist.init_process_group(backend=backend)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)  # small model: threads only fight the other ranks for cores

    if args.global_batch_size % world:
        if rank == 0:
            print(f"error: --global-batch-size {args.global_batch_size} is not divisible by the "
                  f"world size {world}", file=sys.stderr)
        return 2
    per_rank_batch = args.global_batch_size // world

    x_train, x_test, y_train, y_test = load_data(args.seed, args.test_fraction)
    train = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed) if distributed else None
    loader = DataLoader(train, batch_size=per_rank_batch, sampler=sampler,
                        shuffle=sampler is None, drop_last=False)
    xt, yt = torch.from_numpy(x_test).to(device), torch.from_numpy(y_test).to(device)

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = nn.Sequential(
        nn.Linear(64, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 10),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_epoch = 1
    ckdir = checkpoint_dir(args)
    if args.resume:
        path = latest_checkpoint(ckdir)
        if path is not None:
            state = torch.load(path, map_location=device, weights_only=False)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = int(state["epoch"]) + 1
            if rank == 0:
                print(f"resumed from {path} (epoch {state['epoch']}, saved with world size "
                      f"{state['world_size']}, now {world})", flush=True)
        elif rank == 0:
            print(f"no checkpoint in {ckdir}: starting from scratch", flush=True)
    net = DDP(model) if distributed else model
    loss_fn = nn.CrossEntropyLoss()
    if rank == 0:
        print(f"start world_size={world} backend={backend} device={device} "
              f"train={len(train)} test={len(yt)} per_rank_batch={per_rank_batch} "
              f"epochs={start_epoch}..{args.epochs} checkpoints={ckdir}", flush=True)

    acc = 0.0
    for epoch in range(start_epoch, args.epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        lr = epoch_lr(args.lr, epoch, args.epochs)
        for group in optimizer.param_groups:
            group["lr"] = lr
        net.train()
        t0 = time.perf_counter()
        total_loss, batches = 0.0, 0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(xb), yb)
            loss.backward()
            optimizer.step()
            total_loss, batches = total_loss + loss.item(), batches + 1
        elapsed = time.perf_counter() - t0
        if rank == 0:
            model.eval()
            with torch.no_grad():
                acc = (model(xt).argmax(dim=1) == yt).float().mean().item()
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "epoch": epoch, "world_size": world, "acc": acc,
                     "global_batch_size": args.global_batch_size, "lr": args.lr}
            save_checkpoint(ckdir, state, epoch, args.keep)
            print(f"epoch={epoch} acc={acc:.4f} loss={total_loss / max(1, batches):.4f} "
                  f"samples_per_s={len(train) / elapsed:.0f} world_size={world} lr={lr:.2e} "
                  f"global_batch={args.global_batch_size}", flush=True)
        if distributed:
            dist.barrier()  # nobody races ahead of the checkpoint of this epoch
    if rank == 0:
        print(f"final acc={acc:.4f} world_size={world}", flush=True)
    ok = acc >= args.require_acc or rank != 0 or start_epoch > args.epochs
    if distributed:
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The health gate's network check: a timed all-reduce across the nodes (one torchrun job).

    dl-run --launcher torchrun -- python -m bootstrap_scripts.ops.allreduce --mib 32 --iters 5

Every rank joins one process group (NCCL when CUDA is there, gloo on CPUs), all-reduces a
``--mib`` MiB float32 tensor once to warm up, then ``--iters`` times, timed between barriers.
Each node's local rank 0 prints ``DL-HEALTH {json}`` with its measured bandwidth:

- algbw = bytes / time of one all-reduce
- busbw = algbw * 2(n-1)/n, n the number of ranks: the bytes each rank actually moves in a
  ring all-reduce, comparable across cluster sizes (the convention of NVIDIA's nccl-tests)

The gate compares busbw with its floor (``GateSettings.allreduce_floor_gbps``). With one rank
there is nothing to move (busbw 0). ``--timeout`` bounds the process group's operations, so
a rank whose peer is gone fails instead of waiting forever.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta

MARKER = "DL-HEALTH "


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """busbw of a ring all-reduce: algbw * 2(n-1)/n (0 for a single rank). Pure."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    return algbw * 2 * (ranks - 1) / ranks


def alg_bandwidth(nbytes: int, seconds: float) -> float:
    """Bytes per second of one all-reduce of ``nbytes`` taking ``seconds``. Pure."""
    if seconds <= 0:
        raise ValueError(f"an all-reduce cannot take {seconds} s")
    return nbytes / seconds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="allreduce", description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, default=32.0, help="tensor size in MiB (default 32)")
    p.add_argument("--iters", type=int, default=5, help="timed all-reduces (default 5)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds any collective may take before it fails (default 120)")
    ns = p.parse_args(argv)
    if ns.mib <= 0 or ns.iters < 1 or ns.timeout <= 0:
        p.error(f"--mib, --iters and --timeout must be positive, got {ns.mib}, {ns.iters}, "
                f"{ns.timeout}")
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    backend = "nccl" if cuda else "gloo"
    t_init = time.monotonic()
    dist.init_process_group(backend, timeout=timedelta(seconds=ns.timeout))
    world = dist.get_world_size()
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    numel = max(1, int(ns.mib * (1 << 20)) // 4)
    tensor = torch.ones(numel, dtype=torch.float32, device=device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    dist.all_reduce(tensor)  # warm-up: connections, NCCL rings
    sync()
    times = []
    for _ in range(ns.iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        times.append(time.perf_counter() - t0)
    nbytes = numel * 4
    seconds = statistics.median(times)
    algbw = alg_bandwidth(nbytes, seconds)
    busbw = bus_bandwidth(algbw, world)
    if local_rank == 0:
        line = {"check": "allreduce", "status": "ok", "value": round(busbw / 1e9, 3),
                "detail": f"{backend}, {world} rank(s), {nbytes / (1 << 20):g} MiB, median of "
                f"{ns.iters}: {seconds * 1e3:.1f} ms",
                "busbw_gbps": round(busbw / 1e9, 4), "algbw_gbps": round(algbw / 1e9, 4),
                "backend": backend, "ranks": world, "seconds": round(time.monotonic() - t_init, 3),
                "address": os.environ.get("DEEPLEARNING_NODE_ADDR", "")}
        sys.stdout.write(MARKER + json.dumps(line, sort_keys=True) + "\n")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (``make bench``): dl-run --data's stager against ``aws s3 sync`` (the pinned
awscli in .venv), the same ~1 GB of objects from the same bucket on moto's server over HTTP,
each in a process of its own, into an empty directory, in alternating order over several
rounds. Printed: each client's median and best GB/s, the ratios, and the CPU seconds of the
client and of moto's server (this process) per run; no assertion on speed (one machine, two
cores, moto's Python server as S3: the figure compares the clients, not what S3 would give).

What limits it on two cores: moto serves from one Python process (one core at most, its
GIL), and the client and the kernel's copies share the other. A first write into memory the
virtual machine never touched (or gave back to the host) costs the kernel about 1.7 s per
GiB: ``aws s3 sync`` meets it in the page cache, the stager writes with direct I/O and does
not (``bootstrap_scripts/data/fetch.py``); the median over rounds, not one run, is the
figure."""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

OBJECTS = 96
#: 96 objects from 1 to 20 MiB (a mix: many small shards and a few multipart-sized ones)
SIZES = [(1 + (i * 7) % 20) * 2**20 for i in range(OBJECTS)]
ROUNDS = 3


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall seconds, the client's CPU seconds, this process's = moto's CPU seconds)."""
    kids, me = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(
        resource.RUSAGE_SELF)
    t = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    wall = time.monotonic() - t
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    kids2, me2 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(
        resource.RUSAGE_SELF)
    return (wall, kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime,
            me2.ru_utime + me2.ru_stime - me.ru_utime - me.ru_stime)


@pytest.mark.bench
def test_bench_staging_against_aws_s3_sync(s3env, tmp_path) -> None:
    block = os.urandom(2**20)
    for i, size in enumerate(SIZES):
        s3env.put(f"bench/shard-{i:03d}.bin", block * (size // 2**20))
    total = sum(SIZES)
    env = {**os.environ, "AWS_ENDPOINT_URL": s3env.endpoint, "DL_ROOT": str(s3env.root)}
    stager = [sys.executable, "-m", "bootstrap_scripts.data.stage"]
    clients = {
        "stager": lambda out: [*stager, f"s3://{s3env.bucket}/bench:{out}"],
        "stager at 32": lambda out: [*stager, f"s3://{s3env.bucket}/bench:{out}",
                                     "--concurrency", "32"],
        "aws s3 sync": lambda out: [str(Path(sys.executable).parent / "aws"), "s3", "sync",
                                    f"s3://{s3env.bucket}/bench", str(out), "--endpoint-url",
                                    s3env.endpoint, "--only-show-errors"],
    }
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in clients}
    for round_no in range(ROUNDS):
        order = list(clients) if round_no % 2 == 0 else list(reversed(clients))
        for name in order:
            out = tmp_path / "out"  # cold: a new, empty directory for every run
            runs[name].append(timed(clients[name](out), env))
            copied = sum(p.stat().st_size for p in out.rglob("*.bin"))
            assert copied == total, (name, copied, total)
            shutil.rmtree(out)
    again = timed([*stager, f"s3://{s3env.bucket}/bench:{tmp_path / 'stage2'}"], env)[0]
    second = timed([*stager, f"s3://{s3env.bucket}/bench:{tmp_path / 'stage2'}"], env)[0]

    def gbps(name: str, pick) -> float:
        return total / pick(r[0] for r in runs[name]) / 1e9

    def cpu(name: str, i: int) -> float:
        return statistics.median(r[i] for r in runs[name])

    med = {n: gbps(n, statistics.median) for n in clients}
    best = {n: gbps(n, min) for n in clients}
    ours, theirs, many = med["stager"], med["aws s3 sync"], med["stager at 32"]
    lines = [f"\n[bench] staging {OBJECTS} objects, {total / 1e9:.2f} GB, moto over HTTP, one "
             f"node, {ROUNDS} rounds in alternating order, a cold directory each run "
             f"(default concurrency here: "
             f"{min(32, 4 * (os.cpu_count() or 1))}):"]
    for name in clients:
        lines.append(f"[bench]   {name}: median {med[name]:.3f} GB/s (best {best[name]:.3f}); "
                     f"CPU s per run (median): client {cpu(name, 1):.2f}, moto's server "
                     f"{cpu(name, 2):.2f}")
    lines.append(f"[bench]   ratio stager / aws s3 sync: {ours / theirs:.2f}x median "
                 f"({best['stager'] / best['aws s3 sync']:.2f}x best; at 32: "
                 f"{many / theirs:.2f}x); a second stage of the same data {second:.2f} s "
                 f"(first {again:.1f} s)")
    lines.append("[bench]   limits: moto's server is one Python process (one core at most) "
                 "and shares 2 cores with the client and the kernel's copies")
    print("\n".join(lines))

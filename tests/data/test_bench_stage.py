"""Benchmark (``make bench``): dl-run --data's stager against ``aws s3 sync`` (the pinned
awscli in .venv), the same ~1 GB of objects from the same bucket on moto's server over HTTP,
each in a process of its own, into an empty directory. Printed as GB/s and a ratio; no
assertion on speed (one machine, two cores, moto's Python server as S3: the figure compares
the clients, not what S3 would give)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

OBJECTS = 96
#: 96 objects from 1 to 20 MiB (a mix: many small shards and a few multipart-sized ones)
SIZES = [(1 + (i * 7) % 20) * 2**20 for i in range(OBJECTS)]


def timed(argv: list[str], env: dict[str, str]) -> float:
    t = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return time.monotonic() - t


@pytest.mark.bench
def test_bench_staging_against_aws_s3_sync(s3env, tmp_path) -> None:
    block = os.urandom(2**20)
    for i, size in enumerate(SIZES):
        s3env.put(f"bench/shard-{i:03d}.bin", block * (size // 2**20))
    total = sum(SIZES)
    env = {**os.environ, "AWS_ENDPOINT_URL": s3env.endpoint, "DL_ROOT": str(s3env.root)}
    figures = {}
    stager = [sys.executable, "-m", "bootstrap_scripts.data.stage"]
    for name, argv, out in (
        ("dl-run --data (stager)", [*stager, f"s3://{s3env.bucket}/bench:{tmp_path / 'stage'}"],
         tmp_path / "stage"),
        ("stager at 10", [*stager, f"s3://{s3env.bucket}/bench:{tmp_path / 'ten'}",
                          "--concurrency", "10"], tmp_path / "ten"),
        ("aws s3 sync", [str(Path(sys.executable).parent / "aws"), "s3", "sync",
                         f"s3://{s3env.bucket}/bench", str(tmp_path / "sync"),
                         "--endpoint-url", s3env.endpoint, "--only-show-errors"],
         tmp_path / "sync"),
    ):
        seconds = timed(argv, env)
        copied = sum(p.stat().st_size for p in out.rglob("*.bin"))
        assert copied == total, (name, copied, total)
        figures[name] = total / seconds / 1e9
        shutil.rmtree(out)
    again = timed([sys.executable, "-m", "bootstrap_scripts.data.stage",
                   f"s3://{s3env.bucket}/bench:{tmp_path / 'stage2'}"], env)
    second = timed([sys.executable, "-m", "bootstrap_scripts.data.stage",
                    f"s3://{s3env.bucket}/bench:{tmp_path / 'stage2'}"], env)
    ours, theirs = figures["dl-run --data (stager)"], figures["aws s3 sync"]
    ten = figures["stager at 10"]
    print(f"\n[bench] staging {OBJECTS} objects, {total / 1e9:.2f} GB, moto over HTTP, one "
          f"node: stager {ours:.3f} GB/s (32 at once, its default; {ten:.3f} GB/s at 10, the "
          f"CLI's default), aws s3 sync {theirs:.3f} GB/s, ratio {ours / theirs:.2f}x "
          f"({ten / theirs:.2f}x at 10); a second stage of the same data: {second:.2f} s "
          f"(first {again:.1f} s)")

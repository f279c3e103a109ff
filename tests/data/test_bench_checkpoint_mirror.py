"""Benchmark (``make bench``): what the checkpoint mirror costs a training loop. A loop of
CPU-bound "steps" saves a 32 MiB checkpoint (data file, then manifest last) every 10 steps,
once alone and once with the mirror (``checkpoint_mirror watch``, a process of its own as
on a node) uploading each checkpoint to moto's S3 server over HTTP. Printed: the stall per
checkpoint (the loop's extra time over its steps alone, per checkpoint) with and without the
mirror; no assertion on speed (two shared cores, moto's Python server as S3)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap_scripts.data import checkpoint_plan as cp
from tests.conftest import REPO_ROOT

STEPS, EVERY, SIZE = 60, 10, 32 * 2**20
BLOCK = os.urandom(2**20)


def step() -> None:
    h = hashlib.sha256()
    for _ in range(24):
        h.update(BLOCK)


def save(directory: Path, n: int) -> None:
    name = f"step-{n:06d}"
    data = directory / f"{name}.pt"
    with open(f"{data}.tmp", "wb") as fh:
        for _ in range(SIZE // len(BLOCK)):
            fh.write(BLOCK)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(f"{data}.tmp", data)
    m = cp.new_manifest(name, n, time.time(), [(data.name, SIZE)])
    (directory / f".{m.manifest_file}.tmp").write_text(m.render())
    os.replace(directory / f".{m.manifest_file}.tmp", directory / m.manifest_file)


def loop(directory: Path) -> float:
    directory.mkdir(parents=True)
    t = time.monotonic()
    for n in range(1, STEPS + 1):
        step()
        if n % EVERY == 0:
            save(directory, n)
    return time.monotonic() - t


@pytest.mark.bench
def test_bench_step_stall_per_checkpoint_with_and_without_the_mirror(s3env, tmp_path) -> None:
    t = time.monotonic()
    for _ in range(STEPS):
        step()
    steps_only = time.monotonic() - t
    checkpoints = STEPS // EVERY
    alone = loop(tmp_path / "alone")
    env = {**os.environ, "AWS_ENDPOINT_URL": s3env.endpoint, "DL_ROOT": str(s3env.root)}
    url = f"s3://{s3env.bucket}/checkpoints/bench/"
    mirror = subprocess.Popen(
        [sys.executable, "-m", "bootstrap_scripts.data.checkpoint_mirror", "watch",
         "--dir", str(tmp_path / "mirrored"), "--url", url, "--every", "1"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        mirrored = loop(tmp_path / "mirrored")
        t = time.monotonic()
        mirror.send_signal(signal.SIGTERM)  # its last pass uploads what is left
        out, _ = mirror.communicate(timeout=300)
        drain = time.monotonic() - t
    finally:
        if mirror.poll() is None:
            os.killpg(mirror.pid, signal.SIGKILL)
            mirror.wait()
    keys = s3env.s3.list_objects_v2(Bucket=s3env.bucket,  # type: ignore[attr-defined]
                                    Prefix="checkpoints/bench/").get("Contents", [])
    manifests = [k["Key"] for k in keys if k["Key"].endswith(cp.MANIFEST_SUFFIX)]
    assert len(manifests) == checkpoints, out  # every checkpoint mirrored, whole
    print(f"\n[bench] checkpoint mirror: {checkpoints} checkpoints of {SIZE >> 20} MiB, "
          f"{STEPS} steps ({steps_only / STEPS * 1000:.0f} ms each alone)")
    print(f"[bench]   step stall per checkpoint without the mirror: "
          f"{(alone - steps_only) / checkpoints * 1000:.0f} ms")
    print(f"[bench]   step stall per checkpoint with the mirror:    "
          f"{(mirrored - steps_only) / checkpoints * 1000:.0f} ms "
          f"(its last pass after the loop: {drain:.1f} s)")

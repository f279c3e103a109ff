"""Benchmark (``make bench``): the training loop's stall per checkpoint, the example job's
checkpoints written in the loop (``--sync-checkpoints``) vs by its background writer (the
default), without and with the S3 mirror beside it.

How the figure is produced: the real example (``bootstrap_scripts.examples.train_digits``, one
process, CPU, a 64-1536-1536-10 MLP so that a checkpoint is ~29 MB: weights and Adam's two
moments) trains EPOCHS epochs of 23 steps, a step checkpoint every EVERY steps. Its last line
reports ``loop_s``, the time spent in its step loops (a checkpoint's stall included: the
copy and any wait for the previous save, and the writer's competition for the CPU), and
what each save cost the loop (``blocked_ms_per_save``) and the writer (``write_ms_per_save``).
The same run with ``--checkpoint-every 0`` (epoch-end checkpoints only, outside the step
loop) is the baseline; the stall per checkpoint is ``(loop_s - baseline) / step
checkpoints``. Each configuration runs ROUNDS times, interleaved, and the median is printed.
With the mirror, ``checkpoint_mirror watch`` (a process of its own, as on a node; a pass
every second so that it uploads while the short run trains) copies each checkpoint to
moto's S3 server over HTTP. Printed, not asserted: two shared cores, the checkpoint
directory on local disk (EFS's network round trips would make the synchronous write
longer), moto's Python server as S3.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap_scripts.data import checkpoint_plan as cp
from tests.conftest import REPO_ROOT

EPOCHS, EVERY, HIDDEN, ROUNDS = 3, 5, 1536, 3
STEP_CHECKPOINTS = EPOCHS * len(range(EVERY, 23, EVERY))  # 23 steps an epoch, none at 23
SUMMARY = re.compile(r"^checkpoints mode=(\w+) saves=(\d+) blocked_ms_per_save=([\d.]+) "
                     r"write_ms_per_save=([\d.]+) waited_for_previous=(\d+) loop_s=([\d.]+)$",
                     re.M)


def train(ckdir: Path, *args: str) -> dict[str, float]:
    """One real run of the example; its summary line's figures."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "bootstrap_scripts.examples.train_digits", "--epochs",
         str(EPOCHS), "--hidden", str(HIDDEN), "--checkpoint-dir", str(ckdir), *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    m = SUMMARY.search(res.stdout)
    assert m, res.stdout
    return {"saves": int(m[2]), "blocked_ms": float(m[3]), "write_ms": float(m[4]),
            "waited": int(m[5]), "loop_s": float(m[6])}


def mirrored(s3env, ckdir: Path, prefix: str, *args: str) -> dict[str, float]:
    """``train`` with the checkpoint mirror watching ``ckdir``; its last pass after the run."""
    ckdir.mkdir(parents=True)
    env = {**os.environ, "AWS_ENDPOINT_URL": s3env.endpoint, "DL_ROOT": str(s3env.root)}
    url = f"s3://{s3env.bucket}/checkpoints/{prefix}/"
    mirror = subprocess.Popen(
        [sys.executable, "-m", "bootstrap_scripts.data.checkpoint_mirror", "watch",
         "--dir", str(ckdir), "--url", url, "--every", "1"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        figures = train(ckdir, *args)
        mirror.send_signal(signal.SIGTERM)
        out, _ = mirror.communicate(timeout=300)
    finally:
        if mirror.poll() is None:
            os.killpg(mirror.pid, signal.SIGKILL)
            mirror.wait()
    keys = s3env.s3.list_objects_v2(Bucket=s3env.bucket,  # type: ignore[attr-defined]
                                    Prefix=f"checkpoints/{prefix}/").get("Contents", [])
    names = {k["Key"].rsplit("/", 1)[1] for k in keys}
    assert f"epoch-{EPOCHS:04d}{cp.MANIFEST_SUFFIX}" in names, out  # the last one mirrored
    return figures


@pytest.mark.bench
def test_bench_loop_stall_per_checkpoint_sync_vs_async(s3env, tmp_path) -> None:
    every = ("--checkpoint-every", str(EVERY))
    configs = {
        "baseline": lambda d, n: train(d, "--checkpoint-every", "0"),
        "sync": lambda d, n: train(d, *every, "--sync-checkpoints"),
        "async": lambda d, n: train(d, *every),
        "sync + mirror": lambda d, n: mirrored(s3env, d, f"sync{n}", *every,
                                               "--sync-checkpoints"),
        "async + mirror": lambda d, n: mirrored(s3env, d, f"async{n}", *every),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    for n in range(ROUNDS):
        for name, run in configs.items():
            runs[name].append(run(tmp_path / f"{name.replace(' + ', '-')}-{n}", n))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    base = median("baseline", "loop_s")
    print(f"\n[bench] loop stall per checkpoint, the example job (real process, CPU, hidden "
          f"{HIDDEN}: ~29 MB a checkpoint), {EPOCHS} epochs x 23 steps, a step checkpoint "
          f"every {EVERY} steps ({STEP_CHECKPOINTS}); median of {ROUNDS} interleaved runs; "
          f"step loops alone {base:.2f} s ({base / (EPOCHS * 23) * 1000:.0f} ms a step)")
    print("[bench]   (stall = (loop_s - baseline loop_s) / step checkpoints; blocked = the "
          "loop inside save(); write = the writer's time for one checkpoint)")
    for name in configs:
        if name == "baseline":
            continue
        stall = (median(name, "loop_s") - base) / STEP_CHECKPOINTS * 1000
        print(f"[bench]   {name:15s} stall {stall:6.0f} ms per checkpoint | blocked "
              f"{median(name, 'blocked_ms'):5.1f} ms | write {median(name, 'write_ms'):5.0f} "
              f"ms | waited for the previous save {median(name, 'waited'):.0f} of "
              f"{median(name, 'saves'):.0f}")

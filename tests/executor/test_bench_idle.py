"""Benchmark: an idle executor's CPU with 0 and with 10,000 finished jobs on EFS.

Real processes: one ``dl-executor`` (``python -m bootstrap_scripts.jobs.executor``) per
case, over a plain directory as EFS holding N finished job directories (spec, runner
heartbeat, exit, result, ``done``). Its CPU time (utime + stime from ``/proc/<pid>/stat``)
is read over a window after start-up, and printed as CPU seconds per second. Figures only
(``make bench``); no timing assertions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import stop_popen_group
from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.conftest import REPO_ROOT

ADDRESS = "127.20.250.3"
WARM_UP_SECONDS = 4.0
WINDOW_SECONDS = 10.0
RESULTS: dict[int, float] = {}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def finished_jobs(efs: Path, n: int) -> None:
    for k in range(n):
        nodes = ClusterPaths(efs).job(f"old-{k:05d}").nodes  # the executor scans jobs/<user>/
        nodes.mkdir(parents=True)
        for name in ("spec.json", "runner.json", "result.json", "done"):
            (nodes.parent / name).write_text("{}\n")
        (nodes / "0.exit").write_text("{}\n")


@pytest.mark.bench
@pytest.mark.parametrize("n_finished", [0, 10_000])
def test_bench_idle_executor_cpu(tmp_path: Path, n_finished: int) -> None:
    efs = tmp_path / "efs"
    efs.mkdir()
    finished_jobs(efs, n_finished)
    p = subprocess.Popen(
        [sys.executable, "-m", "bootstrap_scripts.jobs.executor", "--root",
         str(tmp_path / "node"), "--mount-point", str(efs), "--no-mount", "--address", ADDRESS],
        cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, process_group=0)
    try:
        time.sleep(WARM_UP_SECONDS)
        before, t0 = cpu_seconds(p.pid), time.monotonic()
        time.sleep(WINDOW_SECONDS)
        used, elapsed = cpu_seconds(p.pid) - before, time.monotonic() - t0
        assert p.poll() is None
    finally:
        stop_popen_group(p)
    RESULTS[n_finished] = used / elapsed
    print(f"\nidle dl-executor (a real process), {n_finished} finished job directories: "
          f"{1000 * used / elapsed:.1f} ms CPU per second ({used:.2f} s over {elapsed:.1f} s)")

"""Fault drill (47.7), the smaller faults, on the shared emulated cluster (conftest): what a
cancelled attempt leaves as its result, and a worker's local disk filled to the last byte.

- ``dl-jobs cancel`` of a running managed job: the job's record and its attempt's
  ``result.json`` both say ``cancelled`` (before, the attempt's result said ``failed``);
- a full local disk: a tmpfs of 1 MiB, filled, mounted over one worker's executor state
  (where a share's status files and the executor's own records live, and what its heartbeat
  measures): ``dl-health`` names that node's disk, no ``*.status.tmp.*`` is left there by a
  job that ran meanwhile, the executors and the controller stay up, and once the disk has
  room again a job completes exactly once.

Two of the issue's smaller faults are not played here: the kernel's OOM killer and a jump of
the wall clock would hit every other process of a shared test machine. They are proven
narrower: ``tests/executor/test_oom.py`` (a failed share names the OOM killer from the
kernel's ``oom_kill`` counter) and ``tests/jobs/test_progress_clock.py`` (a step is timed on
the monotonic clock, so a wall-clock jump is no slow step).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from bootstrap_scripts.agent.install import BIN_DIR
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.records import JobResult
from emulator.nodes import base_env
from tests.chaos.drills import JOB, attempts, completions, drill, record, wait_for

pytestmark = pytest.mark.chaos
TERMINAL = ("succeeded", "failed", "cancelled")
RANKS = 2


def submit(c, *args: str) -> str:
    res = c.run("--detach", "--json", *args, managed=True, timeout=60)
    assert res.returncode == 0, res.stdout
    return json.loads(res.stdout.strip().splitlines()[-1])["job_id"]


def finished(c, job_id: str, timeout: float = 180):
    return wait_for(f"job {job_id} to end: {c.controller_log()[-2000:]}",
                    lambda: (r := record(c.efs, job_id)) and r.state in TERMINAL and r, timeout)


def daemons_alive(c) -> bool:
    return all(p.poll() is None for p in c.executors.values()) and \
        c.controller is not None and c.controller.poll() is None


def dl_health(c) -> dict:
    """``dl-health --json`` through the master's installed wrapper."""
    res = subprocess.run([str(c.master_root / BIN_DIR / "dl-health"), "--root",
                          str(c.master_root), "--json"], env=base_env(), text=True,
                         capture_output=True, timeout=120)
    return json.loads(res.stdout)


@contextlib.contextmanager
def full_disk(where: Path):
    """A 1 MiB tmpfs over ``where``, filled to its last byte (what was there is hidden
    until it goes)."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "dl-chaos-disk", str(where)],
                   check=True, timeout=30)
    try:
        fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)


def test_47_7_a_cancelled_attempts_result_and_a_full_local_disk(chaos_cluster):
    c = chaos_cluster
    with drill("(47.7) smaller faults", "dl-jobs cancel of a running job; a worker's local "
               "disk full (1 MiB tmpfs over its executor state)") as row:
        job_id = submit(c, "--launcher", "each", "--", "python", JOB, "--lines", "600",
                        "--every", "0.1")
        wait_for(f"job {job_id} running", lambda: (r := record(c.efs, job_id)) and
                 r.state == "running" and attempts(c.efs, job_id), 120)
        res = c.dl_jobs("cancel", job_id)
        row.check("cancel accepted", res.returncode == 0, res.stdout + res.stderr)
        rec = finished(c, job_id)
        row.check("record cancelled", rec.state == "cancelled", rec.state)
        last = attempts(c.efs, job_id)[-1]
        result = wait_for("the attempt's result", lambda: store.read_record_or_none(
            last.result, JobResult), 60)
        row.check("attempt's result cancelled", result.status == "cancelled", result.status)

        worker = next(a for a in c.roots if a != c.membership.master_addr)
        state = NodePaths(c.roots[worker]).executor_state_dir
        with full_disk(state):
            def disk_cell() -> dict | None:
                node = next(n for n in dl_health(c)["nodes"] if n["address"] == worker)
                return node.get("disk") if not node.get("disk", {}).get("ok", True) else None
            cell = wait_for("dl-health to name the full disk", disk_cell, 60)
            row.check("dl-health names the disk", "MiB free" in cell["detail"], str(cell))
            during = submit(c, "--launcher", "each", "--", "python", JOB, "--lines", "3")
            ended = finished(c, during)
            left = sorted(p.name for p in state.iterdir() if ".status.tmp." in p.name)
            row.check("no status temp files", not left, str(left))
            row.check("daemons up on a full disk", daemons_alive(c), ended.state)
        time.sleep(2)  # the executor's next heartbeat measures the disk it has again
        after = submit(c, "--launcher", "each", "--", "python", JOB, "--lines", "5")
        rec = finished(c, after)
        row.check("a job after completes", rec.state == "succeeded", rec.message)
        row.check("once", completions(c.efs, after, RANKS) == 1, "completed more or less")
        row.check("daemons up", daemons_alive(c))

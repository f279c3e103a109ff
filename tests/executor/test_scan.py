"""An idle executor's cost does not grow with the cluster's history of finished jobs.

In-process executor (``Executor.step``, one pass of its loop) over a real directory tree;
the listings of ``jobs/`` are counted by spying on ``os.scandir``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor import discovery
from bootstrap_scripts.jobs.executor.daemon import Executor
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import RunnerHeartbeat

ADDRESS = "127.20.250.2"
FINISHED = 2000


def finished_jobs(efs: Path, n: int) -> None:
    for k in range(n):
        d = ClusterPaths(efs).job(f"old-{k:05d}").dir
        (d / "nodes").mkdir(parents=True)
        (d / "done").write_text("succeeded\n")


@pytest.fixture()
def executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    finished_jobs(tmp_path / "efs", FINISHED)
    ex = Executor(tmp_path / "node", tmp_path / "efs", ADDRESS)
    listed: list[str] = []
    real = os.scandir

    def scandir(path=".", *a):
        if Path(path).parent == ex.node.cluster.jobs_dir:  # a user's jobs listed
            listed.append(str(path))
        return real(path, *a)

    monkeypatch.setattr(discovery.os, "scandir", scandir)
    yield ex, listed
    ex.shares.stop_all("test over")


def publish(ex: Executor, job_id: str) -> None:
    paths = ex.node.cluster.job(job_id)
    store.write_record(paths.runner_heartbeat, RunnerHeartbeat(seq=1, time=time.time()))
    store.atomic_write(paths.spec, JobSpec(job_id=job_id, launcher="each", shares=(Share(
        0, ADDRESS, (Proc(argv=(sys.executable, "-c", "import time; time.sleep(600)")),)),
    )).to_json())


def test_an_idle_executor_does_not_list_the_finished_jobs_again(executor):
    ex, listed = executor
    ex.step()
    # start-up: one listing (of every user's directory)
    assert len(listed) == len(ex.scanner.users) and len(ex.scanner.seen) == FINISHED
    time.sleep(discovery.FOLLOW_UP_SECONDS + 0.1)
    listed.clear()
    for _ in range(25):  # five seconds' worth of polls
        ex.step()
    assert listed == []


def test_a_new_job_is_still_seen_at_once(executor):
    ex, listed = executor
    ex.step()
    time.sleep(discovery.FOLLOW_UP_SECONDS + 0.1)
    ex.step()
    publish(ex, "new-job")
    ex.step()
    assert ex.node.cluster.job("new-job").key in ex.shares.running
    # a job dir whose spec comes later stays pending, checked by name without listings
    ex.node.cluster.job("slow-job").nodes.mkdir(parents=True)
    ex.step()
    assert ex.node.cluster.job("slow-job").key in ex.scanner.pending
    time.sleep(discovery.FOLLOW_UP_SECONDS + 0.1)
    ex.step()
    listed.clear()
    paths = ex.node.cluster.job("slow-job")
    store.write_record(paths.runner_heartbeat, RunnerHeartbeat(seq=1, time=time.time()))
    store.atomic_write(paths.spec, JobSpec(job_id="slow-job", launcher="each", shares=(Share(
        0, ADDRESS, (Proc(argv=(sys.executable, "-c", "import time; time.sleep(600)")),)),
    )).to_json())
    ex.step()
    assert paths.key in ex.shares.running and listed == []

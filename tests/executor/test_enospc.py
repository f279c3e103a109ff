"""EFS full (ENOSPC): the executor keeps running, fails only the share it cannot record
for, and records what it owes once space returns.

The executor runs in this process (``Executor.step``, one pass of its loop) with its real
shares (real processes); ENOSPC is injected at the store's one writer,
``protocol.store.atomic_write``, which every record of the executor goes through.
"""

from __future__ import annotations

import errno
import sys
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor.daemon import Executor
from bootstrap_scripts.node import procgroup
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat, RunnerHeartbeat, ShareExit

ADDRESS = "127.20.250.1"


class Disk:
    """``store.atomic_write`` that fails with ENOSPC while ``full``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.refused = 0
        real = store.atomic_write

        def write(path, content, **kw):
            if self.full:
                self.refused += 1
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return real(path, content, **kw)

        monkeypatch.setattr(store, "atomic_write", write)


@pytest.fixture()
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    disk = Disk(monkeypatch)
    ex = Executor(tmp_path / "node", tmp_path / "efs", ADDRESS)
    (tmp_path / "efs").mkdir()
    ex.step()  # the first pass (nothing published yet): later jobs start without probation
    yield ex, disk
    ex.shares.stop_all("test over")


def publish(ex: Executor, job_id: str, argv: tuple[str, ...]) -> ClusterPaths:
    paths = ex.node.cluster.job(job_id)
    store.write_record(paths.runner_heartbeat, RunnerHeartbeat(seq=1, time=time.time()))
    spec = JobSpec(job_id=job_id, launcher="each",
                   shares=(Share(0, ADDRESS, (Proc(argv=argv),)),))
    store.atomic_write(paths.spec, spec.to_json())
    return paths


def passes(ex: Executor, until, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, what
        ex.step()  # must not raise, whatever EFS does
        time.sleep(0.05)


def test_an_exit_that_cannot_be_recorded_is_recorded_when_space_returns(node):
    ex, disk = node
    paths = publish(ex, "exit-3", (sys.executable, "-c", "import time, sys; "
                                   "time.sleep(1); sys.exit(3)"))
    passes(ex, lambda: paths.key in ex.shares.running, "the share never started")
    disk.full = True
    r = ex.shares.running[paths.key]
    passes(ex, r.main_done, "the share never ended")
    for _ in range(10):
        assert not ex.step()  # a failed pass says so (the loop backs off)
    assert disk.refused and not store.exists(paths.exit(0))
    assert paths.key in ex.shares.running  # still owed
    disk.full = False
    passes(ex, lambda: store.exists(paths.exit(0)), "the exit was never recorded")
    rec = store.read_record(paths.exit(0), ShareExit)
    assert rec is not None and (rec.returncode, rec.fault) == (3, "")
    assert "exit-3" not in ex.shares.running
    beat = store.read_record(ex.node.cluster.executor_heartbeat(ADDRESS), ExecutorHeartbeat)
    passes(ex, lambda: (store.read_record(ex.node.cluster.executor_heartbeat(ADDRESS),
                                          ExecutorHeartbeat).seq > beat.seq), "no heartbeat")


def test_a_share_whose_start_cannot_be_recorded_is_stopped_and_only_it(node):
    ex, disk = node
    other = publish(ex, "runs-on", (sys.executable, "-c", "import time; time.sleep(600)"))
    passes(ex, lambda: other.key in ex.shares.running, "the first share never started")
    disk.full = True
    paths = ex.node.cluster.job("unrecorded")
    spec = JobSpec(job_id="unrecorded", launcher="each", shares=(Share(0, ADDRESS, (
        Proc(argv=(sys.executable, "-c", "import time; time.sleep(600)")),)),))
    disk.full = False
    store.write_record(paths.runner_heartbeat, RunnerHeartbeat(seq=1, time=time.time()))
    store.atomic_write(paths.spec, spec.to_json())
    disk.full = True
    for _ in range(5):
        ex.step()
    token = procgroup.share_token(paths.key, 0, ADDRESS)
    assert not [p for p in procgroup.pids_with_token(token) if procgroup.alive(p)]
    assert not store.exists(paths.started(0))
    assert ex.shares.running[other.key].main_done() is False  # the other share runs on
    disk.full = False
    passes(ex, lambda: store.exists(paths.exit(0)), "the failed start was never recorded")
    rec = store.read_record(paths.exit(0), ShareExit)
    assert rec is not None and rec.fault == "infrastructure"
    assert "No space left" in rec.reason
    assert not store.exists(other.exit(0))

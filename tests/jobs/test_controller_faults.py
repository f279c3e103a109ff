"""The job controller's own faults, in process (no cluster): a garbled request, a full EFS,
a second controller on the same node, finished jobs' records past their retention."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli import dl_jobs
from bootstrap_scripts.jobs.controller import daemon, retention
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.node import single_instance
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
from bootstrap_scripts.protocol.paths import ClusterPaths, own_user
from bootstrap_scripts.protocol.run_request import RunRequest

ROOT_DIR = Path(__file__).resolve().parents[2]


def submit(efs: Path, job_id: str) -> Path:
    (efs / "managed").mkdir(exist_ok=True)
    req = ManagedRequest(job_id=job_id, run=RunRequest(job_id=job_id, command=("true",)),
                         submitted_at=time.time())
    return managed.submit(efs, req).dir


def garble(efs: Path, job_id: str) -> None:
    ClusterPaths(efs).managed(job_id).dir.mkdir(parents=True)
    ClusterPaths(efs).managed(job_id).request.write_text('{"job_id": "x", "run": ')


def wait_for(what: str, check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


# -- a garbled request ---------------------------------------------------------------------


def test_a_garbled_request_is_listed_as_failed_with_the_reason(tmp_path, capsys):
    garble(tmp_path, "bad-1")
    (job,) = managed.list_jobs(tmp_path)
    assert (job.job_id, job.state) == ("bad-1", "failed")
    assert "request.json" in job.message and "not valid JSON" in job.message
    assert dl_jobs.main(["--mount-point", str(tmp_path), "show", "bad-1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "failed" and "not valid JSON" in shown["message"]


def test_the_controller_fails_a_garbled_queued_request_in_its_record(tmp_path):
    garble(tmp_path, "bad-1")
    ctl = daemon.Controller(tmp_path / "node", tmp_path)
    assert ctl.next_job() is None
    rec = store.read_record(ClusterPaths(tmp_path).managed("bad-1").record, ManagedJob)
    assert rec.state == "failed" and "not valid JSON" in rec.message
    assert rec.finished_at is not None


# -- EFS full ------------------------------------------------------------------------------


class FullDisk:
    """``store.atomic_write`` raising ENOSPC under ``efs`` while ``full`` (the writer every
    record goes through)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, efs: Path) -> None:
        self.full = True
        self.efs = str(efs)
        real = store.atomic_write

        def write(path, content, **kw):
            if self.full and str(path).startswith(self.efs):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real(path, content, **kw)

        monkeypatch.setattr(store, "atomic_write", write)


def test_a_full_efs_fails_the_job_saying_so_and_the_controller_carries_on(tmp_path,
                                                                           monkeypatch):
    submit(tmp_path, "job-1")
    disk = FullDisk(monkeypatch, tmp_path)
    ctl = daemon.Controller(tmp_path / "node", tmp_path)
    crashed: list[BaseException] = []

    def loop() -> None:
        try:
            ctl.run()
        except BaseException as exc:  # the test's point: nothing gets here
            crashed.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        wait_for("the controller to meet the full EFS", lambda: ctl.pending_records)
        assert not crashed and thread.is_alive()
        assert managed.load_job(ClusterPaths(tmp_path).managed("job-1")) is None
        disk.full = False  # space returns
        rec = wait_for("the job's record", lambda: managed.load_job(
            ClusterPaths(tmp_path).managed("job-1")))
    finally:
        ctl.stopping = True
        thread.join(10)
    assert not crashed, crashed
    assert rec.state == "failed" and "EFS full" in rec.message, rec
    assert not ctl.pending_records


# -- one controller per node ---------------------------------------------------------------


def test_the_lock_admits_one_holder_and_names_it(tmp_path):
    path = tmp_path / "state" / "dl-controller.lock"
    first = single_instance.acquire(path)
    try:
        with pytest.raises(single_instance.AlreadyRunning, match=f"pid {os.getpid()}"):
            single_instance.acquire(path)
    finally:
        first.release()
    single_instance.acquire(path).release()  # free again once released


def test_a_second_controller_on_the_node_exits_with_a_clear_message(tmp_path):
    root, efs = tmp_path / "node", tmp_path / "efs"
    efs.mkdir()
    lock = single_instance.acquire(daemon.lock_path(root))
    try:
        res = subprocess.run(
            [sys.executable, "-m", "bootstrap_scripts.jobs.controller", "--root", str(root),
             "--mount-point", str(efs), "--no-health-gate"], cwd=ROOT_DIR,
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT_DIR)})
    finally:
        lock.release()
    assert res.returncode == 1, res.stderr
    assert "another job controller" in res.stderr and f"pid {os.getpid()}" in res.stderr


# -- retention -----------------------------------------------------------------------------


def finished_job(efs: Path, job_id: str, *, days_ago: float, attempts: int = 1) -> None:
    """A managed job that ended ``days_ago``, with its attempts' job directories."""
    submit(efs, job_id)
    at = time.time() - days_ago * retention.DAY
    managed.save_job(ClusterPaths(efs).managed(job_id), ManagedJob(
        job_id=job_id, state="succeeded", attempt=attempts, finished_at=at))
    for n in range(1, attempts + 1):
        jpaths = ClusterPaths(efs).job(f"{job_id}.{n}")
        jpaths.nodes.mkdir(parents=True)
        jpaths.done.write_text("succeeded\n")
        os.utime(jpaths.done, (at, at))


def test_finished_jobs_past_their_retention_are_archived(tmp_path):
    finished_job(tmp_path, "old-1", days_ago=8, attempts=2)
    finished_job(tmp_path, "new-1", days_ago=1)
    submit(tmp_path, "queued-1")  # never finished: never archived
    unmanaged = ClusterPaths(tmp_path).job("plain-1")
    unmanaged.nodes.mkdir(parents=True)
    unmanaged.done.write_text("failed\n")
    os.utime(unmanaged.done, (time.time() - 30 * retention.DAY,) * 2)

    moved = retention.archive_finished(tmp_path, days=7)
    me = own_user()
    assert sorted(moved) == [f"jobs/{me}/old-1.1", f"jobs/{me}/old-1.2", f"jobs/{me}/plain-1",
                             f"managed/{me}/old-1"]
    assert [j.job_id for j in managed.list_jobs(tmp_path)] == ["new-1", "queued-1"]
    archive = ClusterPaths(tmp_path).archive_dir
    assert (archive / "managed" / me / "old-1" / "job.json").exists()
    assert (archive / "jobs" / me / "old-1.2" / "done").exists()
    assert ClusterPaths(tmp_path).job("new-1.1").dir.exists()
    assert retention.archive_finished(tmp_path, days=0) == []  # 0: keep everything


def test_the_controller_archives_with_its_retention(tmp_path):
    finished_job(tmp_path, "old-1", days_ago=3)
    ctl = daemon.Controller(tmp_path / "node", tmp_path, retention_days=2)
    ctl.step()
    assert managed.list_jobs(tmp_path) == []
    assert (ClusterPaths(tmp_path).archive_dir / "managed" / own_user() / "old-1").is_dir()

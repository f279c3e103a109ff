"""A stall is visible while it lasts (``controller/hangs.HangWatch.stall``, the record's
``stalled``, ``dl-jobs``): no progress on any rank for 5 minutes shows in the job's record
even when the job has no ``--hang-timeout`` (nothing is stopped), and clears once a rank
moves again."""

from __future__ import annotations

import os
from pathlib import Path

from bootstrap_scripts.jobs.cli.dl_jobs import state_cell
from bootstrap_scripts.jobs.controller.hangs import STALL_SECONDS, HangWatch
from bootstrap_scripts.jobs.controller.supervise import JobSupervisor
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.progress import Reporter
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.run_request import RunRequest


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_no_progress_for_five_minutes_is_recorded_without_a_hang_watch(tmp_path: Path):
    req = ManagedRequest(job_id="j", run=RunRequest(job_id="j", command=("true",)),
                         submitted_at=1.0)  # hang_timeout 0: no hang watch
    (tmp_path / "managed").mkdir()
    sup = JobSupervisor(root=tmp_path, efs=tmp_path, paths=managed.submit(tmp_path, req),
                        request=req, job=ManagedJob(job_id="j", state="running", attempt=1),
                        health=None, gate=None,  # type: ignore[arg-type]
                        tick=lambda: None, stopping=lambda: False)
    jpaths = ClusterPaths(tmp_path).job("j.1")
    jpaths.nodes.mkdir(parents=True)
    clock = Clock()
    watch = HangWatch(jpaths, uid=-1, gid=-1, hang_timeout=0.0, clock=clock)
    reporters = [Reporter(jpaths.progress_dir, r, interval=0.0, clock=clock, catch_up=False)
                 for r in (0, 1)]
    for rep in reporters:
        rep.report(1)
    assert not sup.look_at_progress(watch) and sup.job.stalled == ""
    clock.now += STALL_SECONDS + 61  # a partition: every rank waits on its peer
    assert not sup.look_at_progress(watch)  # nothing stopped: no hang watch
    assert sup.job.stalled == "no progress on any rank for 6 min"
    assert managed.load_job(sup.paths).stalled == sup.job.stalled  # on EFS, for dl-jobs
    assert state_cell(sup.job) == "running (stalled 6 min)"
    reporters[0].report(2)  # the link healed
    assert not sup.look_at_progress(watch) and sup.job.stalled == ""
    assert state_cell(sup.job) == "running"
    assert os.listdir(jpaths.progress_dir)

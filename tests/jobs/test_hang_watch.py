"""The progress API (``bootstrap_scripts.progress``) and the controller's watch over it
(``controller/hangs.py``): real files, a stepped clock, a stand-in for the stack dump."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bootstrap_scripts.examples import train_progress
from bootstrap_scripts.jobs.controller import hangs
from bootstrap_scripts.jobs.engine import hang_rules
from bootstrap_scripts.jobs.engine.classify import FailureKind
from bootstrap_scripts.progress import Reporter
from bootstrap_scripts.protocol.managed_records import HangReport, RankStack
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import RankProgress

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_report_is_a_whole_record_written_at_most_once_per_interval(tmp_path: Path) -> None:
    clock = Clock()
    rep = Reporter(tmp_path / "progress", 3, local_rank=1, interval=1.0, clock=clock,
                   catch_up=False)
    assert rep.report(1, loss=2.5, samples_per_s=100)  # the first report is written
    for step in range(2, 6):  # four more steps within the second: none written
        clock.now += 0.2
        assert not rep.report(step)
    clock.now += 0.5
    assert rep.report(6, loss=1.5)
    rec = RankProgress.from_json((tmp_path / "progress" / "3.json").read_text())
    assert (rec.rank, rec.step, rec.local_rank, rec.loss, rec.pid) == (3, 6, 1, 1.5, os.getpid())
    assert rec.time == clock.now and rec.started_at == 1000.0
    assert rec.recent_step_seconds == (0.2, 0.2, 0.2, 0.2, 0.5)  # one per step, oldest first
    assert rec.step_seconds == 0.5
    assert [p.name for p in (tmp_path / "progress").iterdir()] == ["3.json"]  # no temp left
    clock.now += 0.1
    assert not rep.report(7)
    rep.flush()  # what the timer does once the interval ends
    assert RankProgress.from_json((tmp_path / "progress" / "3.json").read_text()).step == 7


def test_the_last_step_is_written_even_if_the_rank_never_reports_again(tmp_path: Path) -> None:
    """A rank that hangs right after a step: the timer writes that step (real time)."""
    rep = Reporter(tmp_path, 0, interval=0.3)
    assert rep.report(1) and not rep.report(2)
    path = tmp_path / "0.json"
    assert RankProgress.from_json(path.read_text()).step == 1
    deadline = time.monotonic() + 5
    while RankProgress.from_json(path.read_text()).step != 2:
        assert time.monotonic() < deadline, "the pending step was never written"
        time.sleep(0.05)


def test_a_script_reports_through_the_environment_and_anywhere_else_it_is_a_no_op(
        tmp_path: Path) -> None:
    code = ("from bootstrap_scripts import progress\n"
            "for s in range(1, 4): progress.report(s, loss=0.5, samples_per_s=10.0)\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": PACKAGE_PARENT, "RANK": "2",
           "LOCAL_RANK": "0", "DL_PROGRESS_DIR": str(tmp_path / "p"),
           "DL_PROGRESS_INTERVAL": "0", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr" / "rank_")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)
    rec = RankProgress.from_json((tmp_path / "p" / "2.json").read_text())
    assert (rec.rank, rec.step, rec.samples_per_s) == (2, 3, 10.0)
    assert (tmp_path / "fr").is_dir()  # torch's flight recorder has its directory
    del env["DL_PROGRESS_DIR"]
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30, cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr", "p"]  # nothing written


def test_a_script_that_ends_within_the_interval_leaves_its_last_step(tmp_path: Path) -> None:
    """Its first step is written at once, the rest wait for the interval's timer, a daemon
    thread the interpreter does not wait for: the last step is written at exit instead,
    with its step time (what the job's StepTime metric is made of)."""
    code = ("from bootstrap_scripts import progress\n"
            "for s in range(1, 30): progress.report(s, loss=0.5, samples_per_s=10.0)\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": PACKAGE_PARENT, "RANK": "0",
           "DL_PROGRESS_DIR": str(tmp_path / "p"), "DL_PROGRESS_INTERVAL": "60"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)
    rec = RankProgress.from_json((tmp_path / "p" / "0.json").read_text())
    assert rec.step == 29 and rec.step_seconds is not None


def write(progress_dir: Path, rank: int, step: int, *, recent=(), name: str = "") -> None:
    progress_dir.mkdir(parents=True, exist_ok=True)
    rec = RankProgress(rank=rank, step=step, time=1000.0 + step, host=f"node{rank}",
                       recent_step_seconds=tuple(recent))
    (progress_dir / (name or f"{rank}.json")).write_text(rec.to_json())


def watch(tmp_path: Path, clock: Clock, timeout: float = 30.0) -> hangs.HangWatch:
    jpaths = ClusterPaths(tmp_path).job("train-1.1")
    return hangs.HangWatch(jpaths, uid=os.getuid(), gid=os.getgid(), hang_timeout=timeout,
                           clock=clock)


def test_the_watch_judges_by_when_it_saw_a_step_move(tmp_path: Path) -> None:
    clock = Clock()
    w = watch(tmp_path, clock)
    d = w.jpaths.progress_dir
    assert w.check(ranks=2) is None  # nothing reported yet: never a hang
    clock.now += 1000
    assert w.check(ranks=2) is None
    write(d, 0, 5)
    write(d, 1, 5)
    assert w.check(ranks=2) is None  # first seen now
    clock.now += 20
    write(d, 0, 6)  # rank 0 moves
    assert w.check(ranks=2) is None
    clock.now += 29
    assert w.check(ranks=2) is None
    clock.now += 1
    hang = w.check(ranks=2)
    assert hang is not None and hang.seconds == 30 and hang.behind == (1,)


def test_the_watch_trusts_no_file_that_is_not_the_ranks_own(tmp_path: Path) -> None:
    clock = Clock()
    w = watch(tmp_path, clock)
    d = w.jpaths.progress_dir
    write(d, 0, 5)
    write(d, 7, 9, name="1.json")  # a file speaking for another rank
    (d / "2.json").symlink_to(d / "0.json")  # a link
    (d / "3.json").write_text("{not json")
    w.check()
    assert w.steps() == {0: 5}


def test_stragglers_are_named_with_their_host(tmp_path: Path) -> None:
    w = watch(tmp_path, Clock())
    d = w.jpaths.progress_dir
    write(d, 0, 9, recent=(1.0,) * 6)
    write(d, 1, 9, recent=(1.0,) * 6)
    write(d, 2, 8, recent=(3.0,) * 6)
    w.check()
    assert w.stragglers() == ("rank 2 on node2: 3 s/step, 3.0x the others' 1 s",)


def test_a_hang_is_recorded_with_every_stack_and_the_odd_rank_named(tmp_path: Path) -> None:
    clock = Clock()
    w = watch(tmp_path, clock, timeout=10)
    d = w.jpaths.progress_dir
    w.jpaths.dir.mkdir(parents=True, exist_ok=True)
    for r in range(3):
        write(d, r, 4)
    w.check()
    clock.now += 11
    hang = w.check(ranks=3)
    assert hang is not None
    allreduce = "distributed_c10d.py:all_reduce;train.py:main"
    dumped = []
    where = {0: "10.0.0.4", 1: "10.0.1.5", 2: "10.0.1.5"}
    written = {0: ("a", allreduce), 1: ("b", "train.py:hang_here;train.py:main"),
               2: ("c", allreduce)}

    def dump(m, job_id, uid, gid):
        """What the nodes do: each rank's stack into the attempt's stacks/, one line each."""
        dumped.append((job_id, uid, gid))
        for r, (stack, sig) in written.items():
            w.jpaths.stacks_dir.mkdir(exist_ok=True)
            w.jpaths.stack(r).write_text(RankStack(rank=r, address="forged", pid=1,
                                                   stack=stack, signature=sig).to_json())
        return {r: {"rank": r, "pid": 10 + r, "address": a, "written": True, "error": ""}
                for r, a in where.items()}, "health-stacks-x"

    m = build_membership(cluster_id="c", generation=1, efs_mount=str(tmp_path),
                         master={"instance_id": "i-m", "address": "10.0.0.4"},
                         workers=[{"instance_id": "i-w", "address": "10.0.1.5"}])
    report_path = tmp_path / "managed" / "train-1" / "attempts" / "1.hang.json"
    failure, rep = hangs.handle(w, hang, attempt=1, m=m, dump=dump, report_path=report_path)
    assert dumped == [("train-1.1", os.getuid(), os.getgid())]
    assert failure.kind is FailureKind.HANG and failure.rank == 1
    assert failure.address == "10.0.1.5"
    assert rep.odd_ranks == (1,) and rep.odd_addresses == ("10.0.1.5",)
    assert "rank(s) 1 on 10.0.1.5" in rep.reason
    saved = HangReport.from_json(report_path.read_text())
    assert [(x.rank, x.step, x.stack, x.odd) for x in saved.ranks] == [
        (0, 4, "a", False), (1, 4, "b", True), (2, 4, "c", False)]
    # where a rank ran is what its node's root dump said, never the user's file
    assert [(x.address, x.pid) for x in saved.ranks] == [
        ("10.0.0.4", 10), ("10.0.1.5", 11), ("10.0.1.5", 12)]
    assert oct(report_path.stat().st_mode & 0o777) == "0o600"
    assert w.jpaths.cancel.read_text().startswith("hang: ")  # the attempt is stopped


def test_a_failed_dump_still_stops_the_attempt(tmp_path: Path) -> None:
    clock = Clock()
    w = watch(tmp_path, clock, timeout=5)
    write(w.jpaths.progress_dir, 0, 2)
    w.check()
    clock.now += 6
    hang = w.check(ranks=2)

    def dump(m, job_id, uid, gid):
        raise OSError("no executor answered")

    report_path = tmp_path / "1.hang.json"
    m = build_membership(cluster_id="c", generation=1, efs_mount=str(tmp_path),
                         master={"instance_id": "i-m", "address": "10.0.0.4"}, workers=[])
    failure, rep = hangs.handle(w, hang, attempt=1, m=m, dump=dump, report_path=report_path)
    assert failure.kind is FailureKind.HANG and rep.odd_ranks == (1,)  # never reported
    assert all(x.error for x in rep.ranks)
    assert json.loads(report_path.read_text())["odd_ranks"] == [1]
    assert w.jpaths.cancel.exists()


def test_dl_jobs_shows_the_running_attempts_stragglers_only(capsys, tmp_path: Path) -> None:
    from bootstrap_scripts.jobs.cli import dl_jobs
    from bootstrap_scripts.protocol.managed_records import ManagedJob, RestartRecord

    lagging = ("rank 2 on node2: 3 s/step, 3.0x the others' 1 s",)
    running = ManagedJob(job_id="j", state="running", stragglers=lagging, restart_log=(
        RestartRecord(attempt=1, at=1.0, kind="hang", detail="no progress"),))
    assert dl_jobs.stragglers_cell(running) == "rank 2"
    dl_jobs.print_show(running, as_json=False, efs=tmp_path)
    out = capsys.readouterr().out
    assert "stragglers:   rank 2 on node2: 3 s/step" in out
    assert "dlc scale --replace ADDRESS" in out  # what to do about it
    assert "stacks: <EFS>/managed/j/attempts/1.hang.json" in out
    finished = ManagedJob(job_id="j", state="succeeded", stragglers=lagging)
    assert dl_jobs.stragglers_cell(finished) == "-"


def test_the_supervisor_restarts_a_hung_attempt_but_never_one_whose_share_ended(
        tmp_path: Path) -> None:
    from bootstrap_scripts.jobs.controller.supervise import JobSupervisor
    from bootstrap_scripts.jobs.engine import managed
    from bootstrap_scripts.protocol import store
    from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
    from bootstrap_scripts.protocol.records import ShareExit
    from bootstrap_scripts.protocol.run_request import RunRequest

    req = ManagedRequest(job_id="j", run=RunRequest(job_id="j", command=("true",),
                                                    hang_timeout=5), submitted_at=1.0)
    (tmp_path / "managed").mkdir()
    sup = JobSupervisor(root=tmp_path, efs=tmp_path, paths=managed.submit(tmp_path, req),
                        request=req, job=ManagedJob(job_id="j", state="running", attempt=1),
                        health=None, gate=None, tick=lambda: None, stopping=lambda: False)
    sup.dump_stacks = lambda m, job_id, uid, gid: ({}, "health-stacks-x")
    clock = Clock()
    jpaths = ClusterPaths(tmp_path).job("j.1")
    w = hangs.HangWatch(jpaths, uid=sup.uid, gid=sup.gid, hang_timeout=5, clock=clock)
    write(jpaths.progress_dir, 0, 3, recent=(1.0,) * 5)
    write(jpaths.progress_dir, 1, 3, recent=(4.0,) * 5)
    assert not sup.look_at_progress(w)
    assert sup.job.stragglers == ("rank 1 on node1: 4 s/step, 4.0x the others' 1 s",)
    clock.now += 6
    store.write_record(jpaths.exit(0), ShareExit(rank=0, address="10.0.0.4", returncode=0))
    assert not sup.look_at_progress(w) and sup.hang is None  # finishing, not hung
    jpaths.exit(0).unlink()
    assert sup.look_at_progress(w)
    assert sup.hang is not None and sup.hang.kind is FailureKind.HANG
    assert sup.hang_or(None) is sup.hang  # the attempt's cancelled end is a hang
    assert store.exists(jpaths.cancel)
    assert store.exists(sup.paths.attempt_hang(1))


def test_a_rank_slow_to_compute_is_named_though_the_all_reduce_equalises_wall_time(
        tmp_path: Path) -> None:
    """The example's ranks (``train_progress.Tracker``): rank 1 computes 0.55 s a step, ranks
    0 and 2 0.25 s and then wait 0.3 s for it in the gradient all-reduce, so every rank's
    step takes 0.56 s of wall time. Each rank's own time (wall less its all-reduce wait) is
    what names rank 1; the wall times alone name nobody."""
    clock = Clock()
    w = watch(tmp_path, clock)
    compute = {0: 0.25, 1: 0.55, 2: 0.25}
    trackers = {r: train_progress.Tracker(clock=clock, report=Reporter(
        w.jpaths.progress_dir, r, interval=0, clock=clock).report) for r in compute}
    for step in range(1, 9):
        start, clock.now = clock.now, clock.now + 0.56  # reduced once rank 1's are in
        for r, t in trackers.items():
            t.waited(start + compute[r], clock.now)  # handed over after its compute
            t.step(step, 0.1, 64)
    w.check()
    host = socket.gethostname()
    assert w.stragglers() == (f"rank 1 on {host}: 0.55 s/step, 2.2x the others' 0.25 s",)
    walls = {r: rec.recent_step_seconds for r, rec in w.records.items()}
    assert walls == {r: (0.56,) * 7 for r in compute}  # equal: nobody stands out
    assert hang_rules.stragglers(walls) == ()

"""Idle stop of the master (``jobs.controller.idle_master``): when the master may stop, as a
table; the controller's turn (the request recorded before it is sent, sent once, again
only after a while, a failure recorded and retried); a woken master ending the stop; the
sessions the master sees (real processes under the names SSM's workers have)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.controller import idle, idle_master
from bootstrap_scripts.jobs.controller.idle import IdleStop
from bootstrap_scripts.jobs.controller.idle_master import MasterStop, Verdict, may_stop
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import IdleStopRecord
from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.support.idle_stop import Clocks

HOUR = 3600.0
T0 = 1_000_000.0
BASE = dict(master_seconds=HOUR, workers_stopped_at=T0, started_at=T0 - HOUR,
            now=T0 + HOUR, queued=False, sharing=False)


@pytest.mark.parametrize(("case", "changes", "expected"), [
    ("idle the whole period after the workers' stop: stop",
     {}, Verdict(True, "", T0 + HOUR)),
    ("not long enough yet", dict(now=T0 + HOUR - 1), Verdict(False, "idle", T0 + HOUR)),
    ("0 disables it", dict(master_seconds=0.0), Verdict(False, "off")),
    ("the workers are not stopped (or only being stopped)", dict(workers_stopped_at=None),
     Verdict(False, "the workers are not stopped")),
    ("a managed job runs or waits", dict(queued=True),
     Verdict(False, "a managed job runs or waits")),
    ("an unmanaged share runs (on the master)", dict(sharing=True),
     Verdict(False, "a job share runs")),
    ("a dlc command or an SSM session is open on the master",
     dict(sessions=("ssm-document-worker[42]",)),
     Verdict(False, "a session is open on the master (ssm-document-worker[42])", T0 + HOUR)),
    ("a worker is still in its group (still draining)", dict(workers_left=1),
     Verdict(False, "1 worker instance(s) still in their group", T0 + HOUR)),
    ("a controller started after the workers' stop (a woken or replaced master) gets the "
     "whole period", dict(started_at=T0 + 600), Verdict(False, "idle", T0 + 600 + HOUR)),
    ("... and stops after it", dict(started_at=T0 + 600, now=T0 + 600 + HOUR),
     Verdict(True, "", T0 + 600 + HOUR)),
])
def test_when_the_master_may_stop(case: str, changes: dict, expected: Verdict) -> None:
    assert may_stop(**{**BASE, **changes}) == expected, case


class Aws:
    """The two AWS sides, played in-process: the worker group's count, the request sent."""

    def __init__(self) -> None:
        self.workers_left, self.sent, self.fail = 0, [], ""

    def groups(self) -> tuple[int, str]:
        return self.workers_left, "master-asg"

    def request(self, event: dict) -> None:
        if self.fail:
            raise RuntimeError(self.fail)
        self.sent.append(event)


def side(efs: Path, clocks: Clocks, aws: Aws, *, instance: str = "i-master1",
         sessions: tuple[str, ...] = ()) -> IdleStop:
    master = MasterStop(master_seconds=HOUR, instance_id=instance, groups=aws.groups,
                        request=aws.request, sessions=lambda: sessions,
                        clock=lambda: clocks.wall)

    def stop(commit) -> tuple[str, int, int] | None:
        return ("workers-asg", 2, 1) if commit("workers-asg", 2, 1) else None

    return IdleStop(efs, idle_seconds=600.0, stop=stop, restore=lambda d, m: d,
                    clock=lambda: clocks.wall, monotonic=lambda: clocks.mono, master=master)


def record(efs: Path) -> IdleStopRecord:
    rec = store.read_record(ClusterPaths(efs).idle_stop, IdleStopRecord)
    assert isinstance(rec, IdleStopRecord)
    return rec


def idle_until_workers_stopped(s: IdleStop, clocks: Clocks) -> None:
    s.tick(queued=False)
    clocks.advance(600.0 + idle.CHECK_SECONDS)
    s.tick(queued=False)
    assert record(s.efs).state == "stopped"


def test_the_master_stops_once_recorded_first_and_asks_again_only_later(tmp_path) -> None:
    clocks, aws = Clocks(), Aws()
    s = side(tmp_path, clocks, aws)
    idle_until_workers_stopped(s, clocks)
    clocks.advance(HOUR - 10)
    s.tick(queued=False)
    assert aws.sent == [], "not idle long enough after the workers' stop"
    clocks.advance(10 + idle.CHECK_SECONDS)
    s.tick(queued=False)
    assert aws.sent == [idle_master.release_request("master-asg", "i-master1")]
    rec = record(tmp_path)
    assert (rec.master_stopped_at, rec.master_instance, rec.master_seconds) == (
        clocks.wall, "i-master1", HOUR)
    assert "master group master-asg -> 0" in rec.message
    clocks.advance(idle.CHECK_SECONDS)
    s.tick(queued=False)
    assert len(aws.sent) == 1, "asked once; the function releases the group"
    clocks.advance(idle_master.REQUEST_AGAIN_SECONDS)
    s.tick(queued=False)
    assert len(aws.sent) == 2, "still alive long after: the invocation may have failed"


def test_a_failed_request_is_recorded_and_tried_again(tmp_path) -> None:
    clocks, aws = Clocks(), Aws()
    s = side(tmp_path, clocks, aws)
    idle_until_workers_stopped(s, clocks)
    aws.fail = "AccessDenied: lambda:InvokeFunction"
    clocks.advance(HOUR + idle.CHECK_SECONDS)
    s.tick(queued=False)
    rec = record(tmp_path)
    assert rec.master_stopped_at is None and "AccessDenied" in rec.message
    aws.fail = ""
    clocks.advance(idle.RETRY_SECONDS + idle_master.LOOK_SECONDS)
    s.tick(queued=False)
    assert len(aws.sent) == 1 and record(tmp_path).master_stopped_at is not None


def test_a_session_or_a_draining_worker_holds_the_master(tmp_path) -> None:
    clocks, aws = Clocks(), Aws()
    s = side(tmp_path, clocks, aws, sessions=("ssm-session-worker[7]",))
    idle_until_workers_stopped(s, clocks)
    clocks.advance(HOUR + idle.CHECK_SECONDS)
    s.tick(queued=False)
    assert aws.sent == [] and record(tmp_path).master_stopped_at is None
    assert s.master is not None
    s.master.sessions = lambda: ()
    aws.workers_left = 1
    clocks.advance(idle_master.LOOK_SECONDS)
    s.tick(queued=False)
    assert aws.sent == []
    aws.workers_left = 0
    clocks.advance(idle_master.LOOK_SECONDS)
    s.tick(queued=False)
    assert len(aws.sent) == 1


def test_a_queued_job_on_the_master_before_it_stops_brings_the_workers_back(tmp_path):
    clocks, aws = Clocks(), Aws()
    s = side(tmp_path, clocks, aws)
    idle_until_workers_stopped(s, clocks)
    clocks.advance(HOUR - 60)
    s.tick(queued=True)
    assert aws.sent == [] and record(tmp_path).state == "busy"


def test_the_woken_master_ends_the_stop_and_gets_the_whole_period(tmp_path) -> None:
    clocks, aws = Clocks(), Aws()
    s = side(tmp_path, clocks, aws)
    idle_until_workers_stopped(s, clocks)
    clocks.advance(HOUR + idle.CHECK_SECONDS)
    s.tick(queued=False)
    assert len(aws.sent) == 1
    clocks.advance(5 * HOUR)  # the master group sat at 0; dlc up woke a new master
    woken_aws = Aws()
    woken = side(tmp_path, clocks, woken_aws, instance="i-master2")
    woken.tick(queued=False)
    rec = record(tmp_path)
    assert (rec.master_stopped_at, rec.master_instance, rec.state) == (None, "", "stopped")
    assert rec.message.startswith("master woken")
    clocks.advance(HOUR - 60)
    woken.tick(queued=False)
    assert woken_aws.sent == [], "the woken master waits the whole period again"
    clocks.advance(60 + idle_master.LOOK_SECONDS)
    woken.tick(queued=False)
    assert woken_aws.sent == [idle_master.release_request("master-asg", "i-master2")]


def exec_done(pid: int, name: str) -> None:
    """Until the child runs the copy (Popen returns between fork and exec)."""
    for _ in range(1000):
        if Path(f"/proc/{pid}/comm").read_text().strip() == name[:15]:
            return
        time.sleep(0.01)
    raise AssertionError(f"{pid} never ran {name}")


def test_the_sessions_seen_are_ssm_workers_processes(tmp_path) -> None:
    """Real processes under the SSM agent's worker names (a copy of sleep): seen while they
    run, and nothing once they are gone."""
    procs = []
    try:
        for name in idle_master.SESSION_PROCESSES:
            exe = tmp_path / name
            shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
            procs.append(subprocess.Popen([str(exe), "60"]))
        for name, proc in zip(idle_master.SESSION_PROCESSES, procs, strict=True):
            exec_done(proc.pid, name)
        seen = idle_master.open_sessions()
        for name, proc in zip(idle_master.SESSION_PROCESSES, procs, strict=True):
            assert f"{name}[{proc.pid}]" in seen
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    seen = idle_master.open_sessions()
    assert not [s for s in seen if any(f"[{p.pid}]" in s for p in procs)]

"""Managed jobs on emulated nodes: the master's job controller runs them, dl-run follows.

Executor-only clusters (``tests.support.cluster``) with the master's real controller unit;
every test stops everything it started and checks that nothing is left.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import JobResult, ShareStarted

pytestmark = pytest.mark.slow
JOB = str(Path(__file__).parent / "jobs" / "managed_job.py")
MANAGED_RE = re.compile(r"^\[(\d) \S+\] managed rank=\d tag=(\S*) job=(\S+) restart=(-?\d+) "
                        r"resume=(\S+) ckpt=(\S+)", re.M)


def job_record(c, job_id: str) -> ManagedJob:
    return store.read_record(ClusterPaths(c.efs).managed(job_id).record, ManagedJob)


def wait_for(what: str, check, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def detach(c, *args: str) -> str:
    res = c.run("--detach", "--json", *args, managed=True, timeout=60)
    assert res.returncode == 0, res.stdout
    return json.loads(res.stdout.strip().splitlines()[-1])["job_id"]


def state_of(c, job_id: str) -> str:
    rec = store.read_record_or_none(ClusterPaths(c.efs).managed(job_id).record, ManagedJob)
    return rec.state if rec else ""


@pytest.fixture()
def cluster(emu):
    c = emu(2)
    c.start_executors()
    c.start_controller()
    return c


def test_submit_follow_succeeds_with_the_first_attempts_variables(cluster):
    c = cluster
    res = c.run("--launcher", "each", "--", "python", JOB, "--tag", "one", managed=True)
    assert res.returncode == 0, res.stdout + c.controller_log()
    ranks = {m.group(1): m.groups()[1:] for m in MANAGED_RE.finditer(res.stdout)}
    (job_id,) = {v[1].rsplit(".", 1)[0] for v in ranks.values()}
    ckpt = str(c.efs / "checkpoints" / pwd.getpwuid(os.geteuid()).pw_name / job_id)
    assert ranks == {r: ("one", f"{job_id}.1", "0", "-", ckpt) for r in ("0", "1")}, res.stdout
    assert f"[dl-run] job {job_id}.1 succeeded on 2 node(s)" in res.stdout
    assert f"[dl-run] job {job_id} succeeded after 1 attempt(s), 0 restart(s)" in res.stdout
    rec = job_record(c, job_id)
    assert (rec.state, rec.attempt, rec.restarts, rec.world_size) == ("succeeded", 1, 0, 2)

    listing = c.dl_jobs("--json")
    assert listing.returncode == 0, listing.stderr
    data = json.loads(listing.stdout)
    assert data["controller"]["alive"] is True
    assert [(j["job_id"], j["state"]) for j in data["jobs"]] == [(job_id, "succeeded")]
    show = c.dl_jobs("show", job_id)
    assert "state:        succeeded" in show.stdout, show.stdout
    missing = c.dl_jobs("show", "nope")
    assert missing.returncode == 2
    assert "no job 'nope'" in missing.stderr and job_id in missing.stderr


def test_detach_then_logs_follow_and_ctrl_c_detaches(cluster):
    c = cluster
    job_id = detach(c, "--launcher", "each", "--", "python", JOB, "--sleep", "3")
    assert re.fullmatch(r"each-\d{8}-\d{6}-[0-9a-f]{6}", job_id)
    # a follower interrupted with Ctrl-C detaches: exit 0, the job goes on
    p = c.popen_runner("--launcher", "each", "--", "python", JOB, "--sleep", "4", managed=True)
    wait_for("the second job to queue", lambda: len(managed.all_paths(c.efs)) == 2)
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    assert "detached: job" in out and "dl-jobs logs" in out and "dl-jobs cancel" in out
    logs = c.dl_jobs("logs", job_id, "-f")
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert len(MANAGED_RE.findall(logs.stdout)) == 2, logs.stdout
    assert f"job {job_id} succeeded after 1 attempt(s)" in logs.stderr
    only1 = c.dl_jobs("logs", job_id, "--node", "1")
    assert [m.group(1) for m in MANAGED_RE.finditer(only1.stdout)] == ["1"], only1.stdout
    second = sorted(p.job_id for p in managed.all_paths(c.efs) if p.job_id != job_id)[0]
    wait_for("the detached job to finish", lambda: state_of(c, second) == "succeeded", 90)


def test_a_queue_runs_in_order_and_cancel_stops_queued_and_running_jobs(cluster):
    c = cluster
    first = detach(c, "--name", "first", "--launcher", "each", "--", "python", JOB,
                   "--sleep", "2", "--tag", "first")
    second = detach(c, "--name", "second", "--launcher", "each", "--", "python", JOB,
                    "--tag", "second")
    third = detach(c, "--name", "third", "--launcher", "each", "--", "python", JOB,
                   "--tag", "third")
    fourth = detach(c, "--name", "fourth", "--launcher", "each", "--", "python", JOB,
                    "--sleep", "120", "--tag", "fourth")
    assert c.dl_jobs("cancel", third).returncode == 0
    wait_for("the running job to start", lambda: state_of(c, fourth) == "running", 120)
    wait_for("its shares", lambda: all(store.exists(ClusterPaths(c.efs).job(
        f"{fourth}.1").started(r)) for r in (0, 1)), 60)
    res = c.dl_jobs("cancel", fourth)
    assert res.returncode == 0 and "stopping attempt 1" in res.stdout, res.stdout
    wait_for("the cancel", lambda: state_of(c, fourth) == "cancelled", 60)
    states = {j: job_record(c, j) for j in (first, second, third, fourth)}
    assert [states[j].state for j in (first, second, third, fourth)] == [
        "succeeded", "succeeded", "cancelled", "cancelled"]
    assert states[third].attempt == 0  # never ran
    assert states[first].finished_at <= states[second].started_at  # one at a time, in order
    assert states[second].finished_at <= states[fourth].started_at
    again = c.dl_jobs("cancel", fourth)
    assert again.returncode == 2 and "already cancelled" in again.stderr
    # the cancelled attempt's own result says so (not "failed")
    result = wait_for("the attempt's result", lambda: store.read_record_or_none(
        ClusterPaths(c.efs).job(f"{fourth}.1").result, JobResult), 60)
    assert result.status == "cancelled", result


def test_a_code_failure_is_not_retried_unless_asked(cluster):
    c = cluster
    res = c.run("--launcher", "each", "--fail-grace", "1", "--", "python", JOB,
                "--fail-attempts", "1", managed=True)
    assert res.returncode == 1, res.stdout
    assert "not retried (--max-code-restarts 0)" in res.stdout, res.stdout
    job_id = MANAGED_RE.search(res.stdout).group(3).rsplit(".", 1)[0]
    rec = job_record(c, job_id)
    assert (rec.state, rec.attempt, rec.restarts) == ("failed", 1, 0)

    res = c.run("--launcher", "each", "--fail-grace", "1", "--max-code-restarts", "1", "--",
                "python", JOB, "--fail-attempts", "1", managed=True)
    assert res.returncode == 0, res.stdout + c.controller_log()
    seen = [(m.group(1), m.group(4), m.group(5)) for m in MANAGED_RE.finditer(res.stdout)]
    assert sorted(seen) == [("0", "0", "-"), ("0", "1", "1"), ("1", "0", "-"), ("1", "1", "1")]
    assert "---- restart 1 of job" in res.stdout and ": code" in res.stdout
    job_id = MANAGED_RE.search(res.stdout).group(3).rsplit(".", 1)[0]
    rec = job_record(c, job_id)
    assert (rec.state, rec.attempt, rec.restarts, rec.code_restarts) == ("succeeded", 2, 1, 1)
    (restart,) = rec.restart_log
    assert (restart.kind, restart.attempt, restart.marked_unhealthy) == ("code", 1, False)
    assert restart.seconds_to_resume is not None and restart.seconds_to_resume >= 0


def test_a_killed_controller_re_attaches_to_the_running_attempt(cluster):
    c = cluster
    job_id = detach(c, "--launcher", "each", "--", "python", JOB, "--sleep-first", "6")
    wait_for("attempt 1's shares", lambda: all(store.exists(ClusterPaths(c.efs).job(
        f"{job_id}.1").started(r)) for r in (0, 1)), 60)
    old = c.controller
    old.send_signal(signal.SIGKILL)
    old.wait(timeout=10)
    c.start_controller()
    wait_for(f"the job to finish: {c.controller_log()}",
             lambda: state_of(c, job_id) in ("succeeded", "failed"), 120)
    rec = job_record(c, job_id)
    # no restart from the checkpoint: the attempt that was running finished the job
    assert (rec.state, rec.attempt, rec.restarts, rec.restart_log) == ("succeeded", 1, 0, ())
    assert rec.controller.endswith(f"/{c.controller.pid}"), rec
    first = ClusterPaths(c.efs).job(f"{job_id}.1")
    assert store.read_text(first.cancel) is None
    assert "re-attaching to attempt 1" in c.controller_log()


def test_a_controller_killed_with_its_attempt_restarts_the_job_as_master_lost(cluster):
    c = cluster
    job_id = detach(c, "--launcher", "each", "--", "python", JOB, "--sleep-first", "120")
    wait_for("attempt 1's shares", lambda: all(store.exists(ClusterPaths(c.efs).job(
        f"{job_id}.1").started(r)) for r in (0, 1)), 60)
    old = c.controller
    runners = c.attempt_runners()
    assert runners
    old.send_signal(signal.SIGKILL)
    for pid in runners:  # the master went away: its attempt runner with it
        os.kill(pid, signal.SIGKILL)
    old.wait(timeout=10)
    c.start_controller()
    wait_for(f"the job to finish: {c.controller_log()}",
             lambda: state_of(c, job_id) in ("succeeded", "failed"), 120)
    rec = job_record(c, job_id)
    assert (rec.state, rec.attempt, rec.restarts) == ("succeeded", 2, 1), rec
    (restart,) = rec.restart_log
    assert restart.kind == "master-lost" and restart.attempt == 1
    assert f"/{old.pid})" in restart.detail
    # the orphaned attempt was stopped through its cancel file, not left to the orphan timeout
    first = ClusterPaths(c.efs).job(f"{job_id}.1")
    assert "orphaned" in (store.read_text(first.cancel) or "")
    starts = [store.read_record(first.started(r), ShareStarted).started_at for r in (0, 1)]
    assert min(starts) > 0
    logs = c.dl_jobs("logs", job_id)
    assert "restart=1 resume=1" in logs.stdout, logs.stdout
    assert "master-lost" in logs.stderr, logs.stderr

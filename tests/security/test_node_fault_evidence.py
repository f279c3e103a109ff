"""Drills: a user cannot get healthy instances replaced, and no storm drains the cluster.

1. A real unprivileged user's managed job SIGKILLs itself on every node (the master
   included). Before, the controller read the signal as a node fault and marked the
   instances Unhealthy (Auto Scaling terminates them); now it is the job's own failure:
   restarted only within ``--max-code-restarts``, no ``SetInstanceHealth``, every instance
   healthy in moto's group, the master untouched.
2. The job controller's circuit breaker: past ``maxReplacementsPerHour`` marks no instance
   is marked (moto's group shows only the allowed ones) and the restart record says why; a
   new controller keeps counting from its predecessor's heartbeat.
3. Root's evidence decides (pure decision table): a "node lost" the attempt reports while the
   node's executor heartbeat moves marks nothing; the master is never marked by a job.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.controller import node_evidence
from bootstrap_scripts.jobs.controller.daemon import Controller
from bootstrap_scripts.jobs.controller.instance_health import (
    BREAKER_OPEN,
    InstanceHealth,
    breaker,
)
from bootstrap_scripts.jobs.controller.supervise import JobSupervisor
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.jobs.engine.classify import Failure, FailureKind
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import (
    BreakerMarks,
    ControllerHeartbeat,
    ManagedJob,
    ManagedRequest,
)
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat
from bootstrap_scripts.protocol.run_request import RunRequest
from emulator.resources import create_cluster
from tests.conftest import REGION
from tests.security.node_fixtures import (  # noqa: F401 - fixtures
    aws_cluster,
    group_health,
    job_user,
    moto_env,
    reachable_python,
    run_as,
)

KILL_SELF = str(Path(__file__).parent / "jobs" / "kill_self.py")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="creating a user needs root")


@root_only
@pytest.mark.slow
def test_a_users_self_sigkill_on_every_node_replaces_no_instance(aws_cluster, job_user,  # noqa: F811
                                                                 moto_reset):
    c, _res = aws_cluster
    c.start_controller(moto_env(moto_reset))
    rc, out = run_as(c, job_user, "--launcher", "each", "--max-code-restarts", "1",
                     "--replace-timeout", "2", "--", "python", KILL_SELF, managed=True)
    assert rc != 0, out
    assert out.count(f"uid={job_user.pw_uid}") >= 4, out  # 2 nodes x 2 attempts, as the user
    (mpaths,) = managed.all_paths(c.efs)  # the user's one job, in managed/<user>/
    job = store.read_record(mpaths.record, ManagedJob)
    assert (job.state, job.attempt, job.restarts, job.code_restarts) == ("failed", 2, 1, 1), \
        (job, c.controller_log())
    (restart,) = job.restart_log
    assert restart.kind == FailureKind.SIGNALLED.value and "SIGKILL" in restart.detail
    assert not restart.marked_unhealthy and job.excluded == ()
    master, worker = c.membership.nodes
    assert group_health(moto_reset) == {master.instance_id: "healthy",
                                        worker.instance_id: "healthy"}
    assert "SetInstanceHealth" not in c.controller_log()


def test_the_breaker_refuses_marks_past_the_hourly_limit(moto_reset, monkeypatch):
    """Real Auto Scaling calls (moto's server): one mark allowed, the second refused."""
    res = create_cluster(moto_reset, cluster_id="sec-breaker", workers=2)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    first, second = (i.instance_id for i in res.node_instances("worker"))
    health = InstanceHealth(REGION, max_per_hour=1)
    assert health.mark_unhealthy(first) == ""
    refused = health.mark_unhealthy(second)
    assert refused.startswith(BREAKER_OPEN) and "maxReplacementsPerHour 1" in refused
    states = group_health(moto_reset)
    assert (states[first], states[second]) == ("unhealthy", "healthy")


@pytest.mark.parametrize(("marks", "limit", "open_"), [
    ((), 3, False), ((100.0, 200.0), 3, False), ((100.0, 200.0, 300.0), 3, True),
    ((-4000.0, -3700.0, 300.0), 3, False),  # older than an hour: no longer counted
    ((), 0, True),  # 0: never replace
])
def test_breaker_table(marks, limit, open_):
    assert bool(breaker(marks, now=1000.0, max_per_hour=limit)) is open_


M = build_membership(cluster_id="c", generation=1, efs_mount="/efs",
                     master={"instance_id": "i-m", "address": "10.0.0.4"},
                     workers=[{"instance_id": "i-w", "address": "10.0.1.5"}])
LOST = Failure(FailureKind.NODE_LOST, "executor heartbeat stopped", "10.0.1.5")


@pytest.mark.parametrize(("failure", "instance", "gone", "mark"), [
    (LOST, "i-w", True, node_evidence.Mark.MARK),
    (LOST, "i-w", False, node_evidence.Mark.EXECUTOR_ALIVE),  # the job said so, root did not
    (LOST, "i-m", True, node_evidence.Mark.MASTER),
    (LOST, "", True, node_evidence.Mark.NO_INSTANCE),
    (Failure(FailureKind.SIGNALLED, "SIGKILL", "10.0.1.5"), "i-w", True,
     node_evidence.Mark.NOT_A_NODE_FAULT),
])
def test_only_roots_evidence_marks_a_node(failure, instance, gone, mark):
    got, why = node_evidence.verdict(failure, instance=instance, master_instance="i-m",
                                     executor_gone=gone)
    assert got is mark
    assert bool(why) is (mark not in (node_evidence.Mark.MARK,
                                      node_evidence.Mark.NOT_A_NODE_FAULT))


def supervisor(tmp_path: Path, health: InstanceHealth) -> JobSupervisor:
    req = ManagedRequest(job_id="j", run=RunRequest(job_id="j", command=("true",)),
                         submitted_at=1.0)
    (tmp_path / "managed").mkdir()
    paths = managed.submit(tmp_path, req)
    return JobSupervisor(root=tmp_path, efs=tmp_path, paths=paths, request=req,
                         job=ManagedJob(job_id="j", state="running", attempt=1),
                         health=health, gate=None, tick=lambda: None, stopping=lambda: False)


def test_a_reported_loss_of_a_node_whose_executor_beats_marks_nothing(tmp_path):
    """The attempt's runner (the job's user) reports node-lost; the node's root executor
    heartbeat keeps moving: no mark, no exclusion, and the record says why."""
    beat = ClusterPaths(tmp_path).executor_heartbeat("10.0.1.5")
    beat.parent.mkdir(parents=True)
    stop = threading.Event()

    def executor() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            store.write_record(beat, ExecutorHeartbeat(address="10.0.1.5",
                                                       heartbeat=time.time(), seq=seq))
            time.sleep(0.2)

    t = threading.Thread(target=executor, daemon=True)
    t.start()
    health = InstanceHealth(REGION, max_per_hour=0)  # any call would be refused: none made
    sup = supervisor(tmp_path, health)
    try:
        sup.record_restart(M, LOST, time.time())
    finally:
        stop.set()
        t.join()
    (rec,) = sup.job.restart_log
    assert not rec.marked_unhealthy and "executor on 10.0.1.5 is alive" in rec.health_error
    assert sup.job.excluded == () and health.marks == []


def test_a_lost_node_past_the_breaker_is_recorded_not_replaced(tmp_path):
    """No executor heartbeat at all (root's evidence of a lost node), but the breaker is
    open: the restart record carries the breaker's reason and nothing is marked."""
    health = InstanceHealth(REGION, max_per_hour=1, marks=[time.time() - 60])
    sup = supervisor(tmp_path, health)
    sup.record_restart(M, LOST, time.time())
    (rec,) = sup.job.restart_log
    assert not rec.marked_unhealthy and rec.health_error.startswith(BREAKER_OPEN)
    assert json.loads(sup.paths.record.read_text())["restart_log"][0]["health_error"] \
        .startswith(BREAKER_OPEN)


def test_a_new_controller_keeps_counting_its_predecessors_marks(tmp_path):
    recent = time.time() - 120
    hb = ClusterPaths(tmp_path).controller_heartbeat
    hb.parent.mkdir(parents=True)
    store.write_record(hb, ControllerHeartbeat(pid=1, heartbeat=time.time() - 30,
                                               state="stopped", replacements=(recent,)))
    # the predecessor's breaker record (a node without a key: unsigned, as it signs nothing)
    store.write_record(ClusterPaths(tmp_path).breaker,
                       BreakerMarks(marks=(recent,), updated_at=recent, controller="i-m/1"))
    ctl = Controller(tmp_path, tmp_path, region=REGION, max_replacements=1)
    ctl.check_alone()
    ctl.adopt_marks()
    assert ctl.health.marks == [recent]
    assert ctl.health.mark_unhealthy("i-w").startswith(BREAKER_OPEN)
    ctl.beat(force=True)
    assert store.read_record(hb, ControllerHeartbeat).replacements == (recent,)

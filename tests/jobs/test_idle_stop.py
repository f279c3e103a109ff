"""Idle stop: the rule as a table, the controller's record of it, and the two Auto Scaling
actions against moto's server (the worker group to zero through scale-in, and back)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootstrap_scripts.agent.node_files import apply_membership
from bootstrap_scripts.jobs.controller import idle
from bootstrap_scripts.jobs.controller.idle import Decision, IdleStop, Phase, decide
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.ops import scale
from bootstrap_scripts.protocol import membership as ms
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.managed_records import IdleStopRecord
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat, Registration
from tests.support.idle_stop import Clocks, group

HOUR = 3600.0


@pytest.mark.parametrize(("case", "kwargs", "expected"), [
    ("first idle look starts the clock",
     dict(idle_seconds=HOUR, queued=False, sharing=False, idle_since=None, stopped=False,
          now=1000.0), Decision(Phase.IDLE, 1000.0, 1000.0 + HOUR)),
    ("still idle, not long enough",
     dict(idle_seconds=HOUR, queued=False, sharing=False, idle_since=1000.0, stopped=False,
          now=1000.0 + HOUR - 1), Decision(Phase.IDLE, 1000.0, 1000.0 + HOUR)),
    ("idle long enough: stop",
     dict(idle_seconds=HOUR, queued=False, sharing=False, idle_since=1000.0, stopped=False,
          now=1000.0 + HOUR), Decision(Phase.STOP, 1000.0, 1000.0 + HOUR)),
    ("a queued or running managed job resets the clock",
     dict(idle_seconds=HOUR, queued=True, sharing=False, idle_since=1000.0, stopped=False,
          now=1000.0 + HOUR), Decision(Phase.BUSY)),
    ("an unmanaged share on a live node resets the clock",
     dict(idle_seconds=HOUR, queued=False, sharing=True, idle_since=1000.0, stopped=False,
          now=1000.0 + HOUR), Decision(Phase.BUSY)),
    ("0 disables it",
     dict(idle_seconds=0.0, queued=False, sharing=False, idle_since=1000.0, stopped=False,
          now=1e9), Decision(Phase.DISABLED)),
    ("stopped, nothing to run: stays stopped",
     dict(idle_seconds=HOUR, queued=False, sharing=False, idle_since=1000.0, stopped=True,
          now=1e9), Decision(Phase.STOPPED, 1000.0)),
    ("stopped, an unmanaged share (on the master) does not bring workers back",
     dict(idle_seconds=HOUR, queued=False, sharing=True, idle_since=1000.0, stopped=True,
          now=1e9), Decision(Phase.STOPPED, 1000.0)),
    ("stopped, a managed job queued: resume",
     dict(idle_seconds=HOUR, queued=True, sharing=False, idle_since=1000.0, stopped=True,
          now=1e9), Decision(Phase.RESUME, 1000.0)),
    ("stopped, a worker started by hand since: the stop is over, its size kept",
     dict(idle_seconds=HOUR, queued=False, sharing=False, idle_since=1000.0, stopped=True,
          now=1e9, rejoined=True), Decision(Phase.ADOPT, 1000.0)),
    ("stopped, a job queued and a worker started by hand: the job's size wins",
     dict(idle_seconds=HOUR, queued=True, sharing=False, idle_since=1000.0, stopped=True,
          now=1e9, rejoined=True), Decision(Phase.RESUME, 1000.0)),
    ("stopped and then disabled by a redeploy: a job still brings the workers back",
     dict(idle_seconds=0.0, queued=True, sharing=False, idle_since=1000.0, stopped=True,
          now=1e9), Decision(Phase.RESUME, 1000.0)),
])
def test_the_idle_stop_rule(case: str, kwargs: dict, expected: Decision) -> None:
    assert decide(**kwargs) == expected, case




def controller_side(efs: Path, clocks: Clocks, idle_seconds: float, calls: list
                    ) -> IdleStop:
    def stop(commit) -> tuple[str, int, int] | None:
        if not commit("workers-asg", 3, 1):
            return None
        calls.append("stop")
        return "workers-asg", 3, 1

    def restore(desired: int, minimum: int) -> int:
        calls.append(("restore", desired, minimum))
        return desired

    return IdleStop(efs, idle_seconds=idle_seconds, stop=stop, restore=restore,
                    clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)


def record(efs: Path) -> IdleStopRecord:
    rec = store.read_record(ClusterPaths(efs).idle_stop, IdleStopRecord)
    assert isinstance(rec, IdleStopRecord)
    return rec


def test_idle_for_the_setting_stops_once_and_a_queued_job_restores_the_size(tmp_path):
    clocks, calls = Clocks(), []
    side = controller_side(tmp_path, clocks, 600.0, calls)
    side.tick(queued=False)
    rec = record(tmp_path)
    assert (rec.state, rec.idle_since, rec.stop_at) == ("idle", clocks.wall,
                                                        clocks.wall + 600.0)
    assert "workers stop at" in managed.idle_text(rec, str)
    clocks.advance(599.0)
    side.tick(queued=False)
    assert calls == []
    clocks.advance(idle.CHECK_SECONDS)  # the executors are looked at every CHECK_SECONDS
    side.tick(queued=False)
    assert calls == ["stop"]
    rec = record(tmp_path)
    assert (rec.state, rec.stopped_at, rec.desired_before, rec.min_before, rec.group) == (
        "stopped", clocks.wall, 3, 1, "workers-asg")
    assert "STOPPED" in managed.idle_text(rec, str)
    clocks.advance(HOUR)
    side.tick(queued=False)
    assert calls == ["stop"], "a stopped cluster is not stopped again"
    side.tick(queued=True)
    assert calls == ["stop", ("restore", 3, 1)]
    rec = record(tmp_path)
    assert (rec.state, rec.stopped_at, rec.idle_since, rec.resumed_at) == (
        "busy", None, None, clocks.wall)


def test_workers_started_by_hand_end_the_stop_at_the_size_they_have(tmp_path):
    clocks, calls = Clocks(), []
    side = controller_side(tmp_path, clocks, 10.0, calls)
    side.tick(queued=False)
    clocks.advance(10.0)
    side.tick(queued=False)
    assert calls == ["stop"]
    # a worker that registered before the stop (it is leaving) changes nothing
    state.write_registration(tmp_path, Registration(
        instance_id="i-old", address="127.20.0.11", role="worker",
        started_at=clocks.wall - 100))
    clocks.advance(idle.CHECK_SECONDS)
    side.tick(queued=False)
    assert calls == ["stop"] and record(tmp_path).stopped_at is not None
    # dl-scale --workers 1: a new worker's agent starts after the stop
    state.write_registration(tmp_path, Registration(
        instance_id="i-new", address="127.20.0.12", role="worker", started_at=clocks.wall))
    clocks.advance(idle.CHECK_SECONDS)
    side.tick(queued=False)
    assert calls == ["stop", ("restore", 0, 1)]  # 0: keep the size they have
    rec = record(tmp_path)
    assert rec.stopped_at is None and "by hand" in rec.message


def test_a_new_controller_carries_on_from_the_record(tmp_path):
    clocks, calls = Clocks(), []
    controller_side(tmp_path, clocks, 600.0, calls).tick(queued=False)
    since = record(tmp_path).idle_since
    clocks.advance(600.0)
    controller_side(tmp_path, clocks, 600.0, calls).tick(queued=False)  # a restarted one
    assert calls == ["stop"] and record(tmp_path).idle_since == since


def test_a_failed_stop_is_recorded_and_tried_again_later(tmp_path):
    clocks, tries = Clocks(), []

    def stop(commit) -> tuple[str, int, int]:
        tries.append(clocks.mono)
        raise RuntimeError("AccessDenied: not authorized to perform UpdateAutoScalingGroup")

    side = IdleStop(tmp_path, idle_seconds=10.0, stop=stop, restore=lambda d, m: d,
                    clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)
    side.tick(queued=False)
    clocks.advance(10.0)
    side.tick(queued=False)
    rec = record(tmp_path)
    assert rec.state == "idle" and rec.stopped_at is None and "AccessDenied" in rec.message
    assert "stop failed" in managed.idle_text(rec, str)
    clocks.advance(idle.CHECK_SECONDS)
    side.tick(queued=False)
    assert len(tries) == 1, "retried before RETRY_SECONDS"
    clocks.advance(idle.RETRY_SECONDS)
    side.tick(queued=False)
    assert len(tries) == 2


def test_a_share_on_a_live_executor_keeps_the_cluster_busy_a_silent_one_does_not(tmp_path):
    clocks, calls = Clocks(), []
    side = controller_side(tmp_path, clocks, 30.0, calls)
    beat = ExecutorHeartbeat(address="127.20.0.11", heartbeat=clocks.wall, seq=1,
                             running=("unmanaged-job",))
    path = ClusterPaths(tmp_path).executor_heartbeat(beat.address)
    for seq in range(2, 40):  # the executor beats every second for 40 s
        store.write_record(path, ExecutorHeartbeat(**{**beat.to_dict(), "seq": seq,
                                                      "running": ("unmanaged-job",)}))
        side.tick(queued=False)
        clocks.advance(1.0)
    assert calls == [] and record(tmp_path).state == "busy"
    # its node went away with the share still listed: silent, so idle from then on
    for _ in range(60):
        side.tick(queued=False)
        clocks.advance(1.0)
    assert calls == ["stop"]


def test_disabled_writes_disabled_and_never_stops(tmp_path):
    clocks, calls = Clocks(), []
    side = controller_side(tmp_path, clocks, 0.0, calls)
    side.tick(queued=False)
    clocks.advance(1e6)
    side.tick(queued=False)
    assert calls == [] and record(tmp_path).state == "disabled"
    assert "off" in managed.idle_text(record(tmp_path), str)


def test_negative_idle_seconds_are_refused_naming_the_option(tmp_path):
    with pytest.raises(ValueError, match="--idle-stop-seconds must be >= 0, got -1"):
        IdleStop(tmp_path, idle_seconds=-1, stop=lambda commit: None, restore=lambda d, m: d)


# -- the AWS side, against moto's server -------------------------------------------------------
@pytest.fixture()
def cloud(moto_reset, monkeypatch, tmp_path):
    """Master + 3 workers (2 base and protected, 1 elastic), the group's minimum 1."""
    from emulator.resources import create_cluster

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    cluster = create_cluster(moto_reset, workers=3, min_workers=1)
    asg = cluster.client("autoscaling")
    efs = tmp_path / "efs"
    ((mid, mip),) = cluster.instances("master")
    workers = cluster.instances("worker")
    m = ms.build_membership(
        cluster_id=cluster.cluster_id, generation=4, efs_mount=str(efs),
        master={"instance_id": mid, "address": mip},
        workers=[{"instance_id": i, "address": a, "base": n < 2}
                 for n, (i, a) in enumerate(workers)])
    state.publish(efs, m, None)
    root = tmp_path / "node"
    apply_membership(root, m, instance_id=mid)
    asg.set_instance_protection(InstanceIds=[n.instance_id for n in m.nodes[1:3]],
                                AutoScalingGroupName=cluster.worker_asg,
                                ProtectedFromScaleIn=True)
    return cluster, root, efs




def test_stop_lifts_protection_and_takes_the_group_to_zero_then_restore_puts_it_back(cloud):
    cluster, root, efs = cloud
    stop, restore = idle.worker_group_actions(root, efs, lambda: cluster.client("autoscaling"))
    recorded: list = []
    assert stop(lambda *size: recorded.append(size) or True) == (cluster.worker_asg, 3, 1)
    assert recorded == [(cluster.worker_asg, 3, 1)], "the size is recorded before the stop"
    g = group(cluster)
    assert (g["MinSize"], g["DesiredCapacity"]) == (0, 0)
    assert not any(i.get("ProtectedFromScaleIn") for i in g["Instances"])
    assert restore(3, 1) == 3
    g = group(cluster)
    assert (g["MinSize"], g["DesiredCapacity"]) == (1, 3)


def test_restore_keeps_a_larger_size_set_by_hand_within_the_maximum(cloud):
    cluster, root, efs = cloud
    autoscaling = cluster.client("autoscaling")
    scale.stop_all_workers(scale.load_cluster(str(root), str(efs), autoscaling), autoscaling)
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=cluster.worker_asg, MaxSize=6,
                                          DesiredCapacity=5)
    c = scale.load_cluster(str(root), str(efs), autoscaling)
    assert scale.restore_workers(c, autoscaling, desired=3, minimum=1) == 5
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=cluster.worker_asg, MaxSize=2,
                                          DesiredCapacity=0, MinSize=0)
    c = scale.load_cluster(str(root), str(efs), autoscaling)
    assert scale.restore_workers(c, autoscaling, desired=3, minimum=1) == 2
    # started by hand (dl-scale --workers 1): the size stays, the minimum comes back
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=cluster.worker_asg,
                                          DesiredCapacity=1, MinSize=0)
    c = scale.load_cluster(str(root), str(efs), autoscaling)
    assert scale.restore_workers(c, autoscaling, desired=0, minimum=1) == 1
    assert (group(cluster)["MinSize"], group(cluster)["DesiredCapacity"]) == (1, 1)


def test_efs_full_never_stops_the_controllers_loop_and_the_workers_wait_for_the_record(
        tmp_path, monkeypatch):
    """No stop without its record first (a successor could not restore the size)."""
    import errno

    clocks, calls = Clocks(), []
    side = controller_side(tmp_path, clocks, 10.0, calls)
    real = store.write_record

    def full(path, rec, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "write_record", full)
    side.tick(queued=False)
    clocks.advance(10.0)
    side.tick(queued=False)  # the loop goes on; the stop waits for its record
    assert calls == [] and not side.stopped
    monkeypatch.setattr(store, "write_record", real)
    clocks.advance(idle.CHECK_SECONDS)
    side.tick(queued=False)
    assert calls == [], "tried again only after RETRY_SECONDS"
    clocks.advance(idle.RETRY_SECONDS)
    side.tick(queued=False)
    assert calls == ["stop"] and record(tmp_path).state == "stopped"

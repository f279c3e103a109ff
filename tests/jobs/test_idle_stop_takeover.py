"""The idle stop across a master take-over while KMS cannot sign (docs/security.md L35).

The controller's records are believed by its successor only when the master signed them.
Before, the idle stop asked Auto Scaling to stop the workers first and recorded the size to
restore after: with KMS unreachable that record was written unsigned, a new master's
controller refused it (rightly: it cannot tell it from a forgery) and forgot to bring the
workers back for the next job. Now the "stopping" record, with the size read first, is
signed before the call, and no call is made without it.

Against moto's server over HTTP: its Auto Scaling group (3 workers, minimum 1) and a real
KMS key of the membership's kind; "KMS unreachable" is a KMS client pointed at a closed port
(a real connection failure through the product's ``MembershipKey``). A "take-over" is a new
``IdleStop`` with a fresh seal, as a new master's controller builds them.
"""

from __future__ import annotations

import logging
import socket
from types import SimpleNamespace

import boto3
import pytest
from botocore.config import Config

from bootstrap_scripts.agent.membership_key import MembershipKey
from bootstrap_scripts.agent.node_files import apply_membership
from bootstrap_scripts.jobs.controller import idle
from bootstrap_scripts.jobs.controller.idle import IdleStop
from bootstrap_scripts.jobs.engine.controller_records import ControllerSeal, Trust
from bootstrap_scripts.protocol import membership as ms
from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.managed_records import IdleStopRecord
from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.conftest import REGION
from tests.support.idle_stop import Clocks, group

IDLE = 10.0


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def cloud(moto_reset, monkeypatch, tmp_path) -> SimpleNamespace:
    """The master's side: the worker group in moto, the membership applied on the master's
    root, the membership key in moto's KMS, and that key as seen through a KMS endpoint that
    refuses connections."""
    from emulator.resources import create_cluster

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    cluster = create_cluster(moto_reset, workers=3, min_workers=1)
    efs, root = tmp_path / "efs", tmp_path / "node"
    ((mid, mip),) = cluster.instances("master")
    m = ms.build_membership(
        cluster_id=cluster.cluster_id, generation=2, efs_mount=str(efs),
        master={"instance_id": mid, "address": mip},
        workers=[{"instance_id": i, "address": a, "base": False}
                 for i, a in cluster.instances("worker")])
    state.publish(efs, m, None)
    apply_membership(root, m, instance_id=mid)
    kms = boto3.client("kms", endpoint_url=moto_reset, region_name=REGION)
    arn = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    dead = boto3.client("kms", endpoint_url=f"http://127.0.0.1:{closed_port()}",
                        region_name=REGION,
                        config=Config(retries={"max_attempts": 1}, connect_timeout=1))
    return SimpleNamespace(cluster=cluster, efs=efs, root=root,
                           key=MembershipKey(arn, REGION),
                           unreachable=MembershipKey(arn, REGION, client=dead))


def controller(c: SimpleNamespace, clocks: Clocks, *, stop=None) -> IdleStop:
    """A controller's idle stop on the master, its seal with the reachable key."""
    seal = ControllerSeal(c.key.sign, c.key.verify)
    real_stop, restore = idle.worker_group_actions(
        c.root, c.efs, lambda: c.cluster.client("autoscaling"))
    return IdleStop(c.efs, idle_seconds=IDLE, stop=stop or real_stop, restore=restore,
                    clock=lambda: clocks.wall, monotonic=lambda: clocks.mono, seal=seal)


def size(c: SimpleNamespace) -> tuple[int, int]:
    g = group(c.cluster)
    return g["DesiredCapacity"], g["MinSize"]


def on_efs(c: SimpleNamespace) -> IdleStopRecord:
    found = ControllerSeal(None, c.key.verify).read(ClusterPaths(c.efs).idle_stop,
                                                     IdleStopRecord, "idle-stop record")
    assert found.trust is Trust.SIGNED, found.why
    assert isinstance(found.record, IdleStopRecord)
    return found.record


def test_kms_down_at_the_stop_stops_nothing_and_a_new_master_runs_the_job_on_workers(
        cloud, caplog):
    c, clocks = cloud, Clocks()
    first = controller(c, clocks)
    first.tick(queued=False)  # idle from now, recorded signed
    clocks.advance(IDLE)
    first.seal.sign = c.unreachable.sign  # KMS unreachable when the stop is due
    with caplog.at_level(logging.WARNING, logger="dl-controller"):
        first.tick(queued=False)
    assert size(c) == (3, 1), "the workers were stopped with no signed record of their size"
    assert "not stopped now" in caplog.text
    assert on_efs(c).state == "idle"  # the master's last signed word, not overwritten
    # the master dies; a new master's controller (KMS reachable) gets a job
    second = controller(c, clocks)
    second.tick(queued=True)
    assert size(c) == (3, 1)


def test_kms_down_after_the_stop_a_new_master_restores_the_recorded_size(cloud):
    c, clocks = cloud, Clocks()
    first = controller(c, clocks)
    real_stop = first.stop_workers

    def stop_then_kms_fails(commit):
        made = real_stop(commit)
        first.seal.sign = c.unreachable.sign  # the "stopped" record cannot be signed
        return made

    first.stop_workers = stop_then_kms_fails
    first.tick(queued=False)
    clocks.advance(IDLE)
    first.tick(queued=False)
    assert size(c) == (0, 0)
    rec = on_efs(c)  # the record signed before the call is still the one on EFS
    assert (rec.state, rec.desired_before, rec.min_before) == ("stopping", 3, 1)
    second = controller(c, clocks)  # the master died; its successor gets a job
    second.tick(queued=True)
    assert size(c) == (3, 1)
    assert on_efs(c).state == "busy"


def test_a_master_dead_between_the_record_and_the_call_has_its_stop_finished(cloud):
    c, clocks = cloud, Clocks()
    first = controller(c, clocks)

    def dies_before_the_call(commit):
        g = group(c.cluster)
        assert commit(g["AutoScalingGroupName"], g["DesiredCapacity"], g["MinSize"])
        raise SystemExit("the master's instance went away")

    first.stop_workers = dies_before_the_call
    first.tick(queued=False)
    clocks.advance(IDLE)
    with pytest.raises(SystemExit):
        first.tick(queued=False)
    assert size(c) == (3, 1) and on_efs(c).state == "stopping"
    second = controller(c, clocks)  # nothing queued: the recorded stop is made
    second.tick(queued=False)
    assert size(c) == (0, 0)
    rec = on_efs(c)
    assert (rec.state, rec.desired_before, rec.min_before) == ("stopped", 3, 1)
    clocks.advance(idle.CHECK_SECONDS)
    second.tick(queued=True)
    assert size(c) == (3, 1)

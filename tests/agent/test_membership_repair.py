"""A corrupt ``membership.json`` and a master restart: the same generation, put back.

Against moto's server: the master forms the cluster (one SUCCESS signal), stops, finds its
membership truncated when it starts again, and must neither form generation 2, nor log its
nodes as ADDED a second time, nor signal the wait condition again.
"""

from __future__ import annotations

import pytest

from bootstrap_scripts.protocol import state as shared
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import Registration
from emulator.resources import create_cluster
from tests.support.agents import AgentThread, config, master_identity, wait_until


def _formed(env, tmp_path):
    endpoint, recorder, _threads = env
    cluster = create_cluster(endpoint, workers=2)
    efs = tmp_path / "efs"
    for wid, wip in cluster.instances("worker"):
        shared.write_registration(efs, Registration(instance_id=wid, address=wip, gpus=2,
                                                    role="worker",
                                                    cluster_id=cluster.cluster_id))
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    first = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                               registration_wait=5), master_identity(cluster))
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "SUCCESS"
    first.stop()
    return cluster, efs


@pytest.mark.parametrize("lost", ["membership", "membership-and-generation-file",
                                  "everything-but-the-signal-record"])
def test_a_truncated_membership_is_put_back_without_a_new_generation(env, tmp_path, lost):
    _endpoint, recorder, threads = env
    cluster, efs = _formed(env, tmp_path)
    paths = ClusterPaths(efs)
    before = shared.read_current(efs)
    log_before = paths.membership_log.read_text()
    assert before.generation == 1 and len(before.nodes) == 3
    text = paths.membership.read_text()
    paths.membership.write_text(text[: len(text) // 2])  # truncated, as by a full disk
    if lost != "membership":
        paths.generation(1).unlink()  # only the groups and the registrations are left
    if lost == "everything-but-the-signal-record":
        paths.membership.unlink()
    second = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url),
                         master_identity(cluster))
    threads.append(second)
    wait_until(lambda: second.agent.formed.is_set(), 30, what="the master to resume")
    after = shared.read_current(efs)  # readable again
    assert after.generation == 1
    assert after.nodes == before.nodes
    assert not paths.generation(2).exists()
    assert paths.membership_log.read_text() == log_before  # no duplicate ADDED lines
    agent_log = paths.agent_log(master_identity(cluster).instance_id).read_text()
    assert "event=membership-repaired generation=1" in agent_log
    assert second.thread.is_alive()
    assert len(recorder.signals) == 1, recorder.signals


def test_the_wait_condition_is_signalled_once_and_recorded(env, tmp_path):
    cluster, efs = _formed(env, tmp_path)
    done = shared.read_wait_signal(efs)
    assert done is not None and done.status == "SUCCESS" and done.generation == 1
    assert done.cluster_id == cluster.cluster_id

"""A master-queue message the agent cannot process goes to the dead-letter queue at once.

Against moto's server: the master agent runs as a thread, the hostile message is on the
real (emulated) master queue, and the dead-letter queue is the one its redrive policy names.
"""

from __future__ import annotations

import json

import pytest

from bootstrap_scripts.agent.lost_notifications import REFUSED_ATTRIBUTE
from bootstrap_scripts.protocol.paths import ClusterPaths
from emulator.resources import create_cluster
from tests.support.agents import AgentThread, config, master_identity, wait_until


def _dead_letters(cluster) -> list[dict]:
    sqs = cluster.client("sqs")
    url = sqs.get_queue_url(QueueName=f"{cluster.cluster_id}-master-dlq")["QueueUrl"]
    return sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0,
                               MessageAttributeNames=["All"]).get("Messages", [])


@pytest.mark.parametrize(("field", "value"), [("desired", "1e400"), ("launched", "-3"),
                                              ("min", "true"), ("max", "NaN")])
def test_a_hostile_number_goes_to_the_dead_letter_queue_at_once(env, tmp_path, field, value):
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    hostile = json.dumps({**cluster.setup_message("worker"), field: "X"}).replace('"X"', value)
    cluster.send(hostile)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                           registration_wait=0.2), master_identity(cluster))
    threads.append(t)
    (sig,) = recorder.wait_for(1, timeout=30)
    # The cluster formed: the refused message neither crashed the agent nor counted as a
    # lost notification.
    assert sig["Status"] == "SUCCESS", sig
    (dead,) = wait_until(lambda: _dead_letters(cluster), 10, what="the dead-lettered message")
    assert dead["Body"] == hostile  # unchanged, for whoever investigates
    refusal = dead["MessageAttributes"][REFUSED_ATTRIBUTE]["StringValue"]
    assert f"field {field!r}" in refusal
    wait_until(lambda: cluster.queue_depth() == 0, 10, what="the master queue to be empty")
    log = ClusterPaths(tmp_path / "efs").agent_log(master_identity(cluster).instance_id)
    text = log.read_text()
    assert text.count("event=refused-message ") == 1, "received more than once"
    assert f"field {field!r}" in text and "event=dead-lettered" in text
    assert t.thread.is_alive() and t.exit_code is None


def test_a_formed_master_survives_a_hostile_membership_change(env, tmp_path):
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                           registration_wait=0.2), master_identity(cluster))
    threads.append(t)
    recorder.wait_for(1, timeout=30)
    (wid, _ip), = cluster.instances("worker")
    body = json.dumps({**cluster.change_message("worker", "terminate", wid),
                       "desired": "X"}).replace('"X"', "1e400")
    cluster.send(body)
    (dead,) = wait_until(lambda: _dead_letters(cluster), 20, what="the dead-lettered message")
    assert dead["Body"] == body
    assert t.thread.is_alive() and t.agent.formed.is_set()

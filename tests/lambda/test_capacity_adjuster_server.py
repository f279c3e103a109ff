"""The handler against moto's real HTTP server, as the local emulator runs it.

The handler's boto3 clients find the server through ``AWS_ENDPOINT_URL`` (boto3 honours it
natively); the master queue is read back by a separate client, as the master agent would.
"""

from __future__ import annotations

import json

import pytest
from adjuster_harness import (
    LAUNCH,
    LAUNCH_ERROR,
    TERMINATE,
    Cloud,
    drop_instances,
    fixture_record,
    import_adjuster,
    lambda_environment,
    sns_event,
)

adjuster = import_adjuster()
WORKERS = "DLClusterStack-WorkerGroupASG-SRV"
MASTER = "DLClusterStack-MasterGroupASG-SRV"


def test_handler_over_http_lowers_capacity_and_reports(
    moto_reset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = moto_reset
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    setup = Cloud(endpoint_url=endpoint)  # the "stack": groups and queue
    queue_url = setup.queue()
    lambda_environment(monkeypatch, queue_url, LOG_LEVEL="INFO")
    [master] = setup.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    workers = setup.group(WORKERS, min_size=0, desired=4, max_size=4)
    # moto shares its backend with this process's ThreadedMotoServer: model one failed launch
    [failed] = drop_instances(WORKERS, 1)

    result = adjuster.handler(
        sns_event(
            fixture_record(LAUNCH, MASTER, master),
            fixture_record(LAUNCH, WORKERS, workers[0]),  # 3 of 4: wait
            fixture_record(LAUNCH_ERROR, WORKERS),  # the failed one: lower to 3
        ),
        None,
    )
    assert result["outcomes"] == ["asg-setup-success", "wait", "asg-setup-success"]

    agent = Cloud(endpoint_url=endpoint)  # a separate client, like the master agent's
    assert agent.desired(WORKERS) == 3
    by_asg = {m["asg"]: m for m in agent.messages(queue_url)}
    assert set(by_asg) == {MASTER, WORKERS}
    assert (by_asg[MASTER]["role"], by_asg[MASTER]["launched"]) == ("master", 1)
    worker_message = by_asg[WORKERS]
    assert (worker_message["status"], worker_message["desired"]) == ("success", 3)
    assert worker_message["launched"] == 3
    assert worker_message["instances"] == sorted(set(workers) - {failed})

    # a worker is later terminated: the agent is told, capacity is left alone
    agent.asg.terminate_instance_in_auto_scaling_group(
        InstanceId=worker_message["instances"][0], ShouldDecrementDesiredCapacity=True
    )
    adjuster.handler(
        sns_event(fixture_record(TERMINATE, WORKERS, worker_message["instances"][0])), None
    )
    [change] = agent.messages(queue_url)
    assert (change["event"], change["change"], change["launched"]) == (
        "membership-change", "terminate", 2,
    )  # fmt: skip
    assert json.dumps(change)  # plain JSON all the way

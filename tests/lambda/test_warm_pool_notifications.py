"""Warm-pool notifications: with ``warmPoolSize`` Auto Scaling also notifies instances going
into the warm pool (``Origin`` EC2, ``Destination`` WarmPool) and pool instances terminated
(``Origin`` WarmPool, ``Destination`` EC2). None of them is a cluster node joining, failing
or leaving: the adjuster must neither report a setup, lower capacity, nor announce a
membership change for them. An instance leaving the pool into service (``Origin`` WarmPool,
``Destination`` AutoScalingGroup) is a launch like any other.

The values are AWS's documented ``Origin`` / ``Destination`` values
(https://docs.aws.amazon.com/autoscaling/ec2/userguide/warm-pools-eventbridge-events.html);
the records are the fixtures' real notifications with only those two fields changed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from adjuster_harness import (
    LAUNCH,
    LAUNCH_ERROR,
    TERMINATE,
    TERMINATE_ERROR,
    Cloud,
    drop_instances,
    fixture_record,
    import_adjuster,
    lambda_environment,
    sns_event,
)
from moto import mock_aws

adjuster = import_adjuster()
WORKERS = "DLClusterStack-WorkerGroupASG-AAAA"


@pytest.fixture()
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cloud, str]]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        c = Cloud()
        queue_url = c.queue()
        lambda_environment(monkeypatch, queue_url)
        yield c, queue_url


def moved(event: str, origin: str, destination: str, instance_id: str | None = None
          ) -> dict[str, Any]:
    record = fixture_record(event, WORKERS, instance_id)
    message = json.loads(record["Sns"]["Message"])
    message["Origin"], message["Destination"] = origin, destination
    record["Sns"]["Message"] = json.dumps(message)
    return record


def test_the_fixtures_are_in_service_notifications() -> None:
    parsed = adjuster.notes.parse_record(fixture_record(LAUNCH, WORKERS))
    assert (parsed.origin, parsed.destination) == ("EC2", "AutoScalingGroup")
    assert not parsed.warm_pool_only


@pytest.mark.parametrize(("event", "origin", "destination"), [
    (LAUNCH, "EC2", "WarmPool"),          # launched into the pool, to be stopped there
    (LAUNCH_ERROR, "EC2", "WarmPool"),    # the pool could not be filled: no node is short
    (TERMINATE, "WarmPool", "EC2"),       # a pool instance terminated: never a member
    (TERMINATE_ERROR, "WarmPool", "EC2"),
])
def test_what_happens_in_the_warm_pool_is_not_a_cluster_node(
        cloud: tuple[Cloud, str], event: str, origin: str, destination: str) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=4, max_size=6)
    drop_instances(WORKERS, 1)  # one in-service launch still outstanding
    instance = "i-0123456789abcdef0" if event != LAUNCH_ERROR else None
    result = adjuster.handler(sns_event(moved(event, origin, destination, instance)), None)
    assert result["outcomes"] == ["warm-pool"]
    assert c.messages(queue) == []  # no setup report, no membership change
    assert c.desired(WORKERS) == 4  # a pool launch error never lowers the group
    assert len(c.instance_ids(WORKERS)) == len(ids) - 1


def test_leaving_the_pool_into_service_is_a_launch(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=3, max_size=6)
    result = adjuster.handler(sns_event(moved(LAUNCH, "WarmPool", "AutoScalingGroup",
                                              ids[-1])), None)
    assert result["outcomes"] == ["asg-setup-success"]
    [message] = c.messages(queue)
    assert (message["event"], message["instances"]) == ("asg-setup", ids)


def test_a_pool_launch_error_would_have_lowered_the_group_as_an_in_service_one(
        cloud: tuple[Cloud, str]) -> None:
    """The same record with the in-service destination lowers desired capacity: what the
    warm-pool test above guards against."""
    c, _queue = cloud
    c.group(WORKERS, min_size=0, desired=4, max_size=6)
    drop_instances(WORKERS, 1)
    adjuster.handler(sns_event(moved(LAUNCH_ERROR, "EC2", "AutoScalingGroup")), None)
    assert c.desired(WORKERS) == 3

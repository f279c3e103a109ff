"""Capacity adjuster against moto (in-process ``mock_aws``) with real boto3 calls."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from adjuster_harness import (
    FIXTURE_BY_EVENT,
    LAUNCH,
    LAUNCH_ERROR,
    REPO_ROOT,
    TERMINATE,
    TERMINATE_ERROR,
    TEST_NOTIFICATION,
    Cloud,
    drop_instances,
    fixture_record,
    import_adjuster,
    lambda_environment,
    lifecycle_record,
    load_fixture,
    log_lines,
    set_lifecycle_state,
    sns_event,
)
from botocore.exceptions import ClientError
from moto import mock_aws

adjuster = import_adjuster()
WORKERS = "DLClusterStack-WorkerGroupASG-AAAA"
MASTER = "DLClusterStack-MasterGroupASG-BBBB"


@pytest.fixture()
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cloud, str]]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    # moto's ~1300 default AMIs cost seconds per backend and these tests never list images
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        c = Cloud()
        queue_url = c.queue()
        lambda_environment(monkeypatch, queue_url)
        yield c, queue_url


@pytest.fixture()
def set_desired_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record every capacity change the handler makes (and still make it)."""
    calls: list[tuple[str, int]] = []
    original = adjuster.AwsClients.set_desired_capacity

    def spy(self: Any, name: str, desired: int) -> None:
        calls.append((name, desired))
        original(self, name, desired)

    monkeypatch.setattr(adjuster.AwsClients, "set_desired_capacity", spy)
    return calls


def run(*records: dict[str, Any]) -> dict[str, Any]:
    return adjuster.handler(sns_event(*records), None)


# --- fixtures have the real service's shape -------------------------------------------


@pytest.mark.parametrize("event", sorted(FIXTURE_BY_EVENT))
def test_fixture_has_real_notification_shape(event: str) -> None:
    record = load_fixture(FIXTURE_BY_EVENT[event])["Records"][0]
    assert record["EventSource"] == "aws:sns"
    assert isinstance(record["Sns"]["Message"], str)  # a JSON string, not an object
    message = json.loads(record["Sns"]["Message"])
    assert message["Event"] == event
    assert message["Service"] == "AWS Auto Scaling"
    if event == TEST_NOTIFICATION:
        assert set(message) == {
            "AccountId", "RequestId", "AutoScalingGroupARN", "AutoScalingGroupName",
            "Service", "Event", "Time",
        }  # fmt: skip
    else:
        for key in (
            "Origin", "Destination", "Progress", "AccountId", "Description", "RequestId",
            "EndTime", "AutoScalingGroupARN", "ActivityId", "StartTime", "Time",
            "EC2InstanceId", "StatusCode", "StatusMessage", "Details",
            "AutoScalingGroupName", "Cause",
        ):  # fmt: skip
            assert key in message, key
    parsed = adjuster.notes.parse_record(record)
    assert parsed.event == event
    assert parsed.group_name == message["AutoScalingGroupName"]


# --- launch ---------------------------------------------------------------------------


def test_launch_reaching_desired_reports_success(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=3, max_size=4)
    result = run(fixture_record(LAUNCH, WORKERS, ids[-1]))
    assert result["outcomes"] == ["asg-setup-success"]
    [message] = c.messages(queue)
    assert message["event"] == "asg-setup"
    assert message["status"] == "success"
    assert (message["min"], message["desired"], message["max"], message["launched"]) == (
        0, 3, 4, 3,
    )  # fmt: skip
    assert message["instances"] == ids
    assert message["role"] == "worker"
    assert message["cluster_id"] == "DLClusterStack"
    assert message["cause"] == ""
    assert message["sent_at"].endswith("Z")
    assert len(message["dedupe_key"]) == 32
    assert c.desired(WORKERS) == 3


def test_master_group_role_is_master(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    [instance] = c.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    run(fixture_record(LAUNCH, MASTER, instance))
    [message] = c.messages(queue)
    assert (message["role"], message["status"], message["instances"]) == (
        "master", "success", [instance],
    )  # fmt: skip


def test_launch_short_of_desired_waits_for_the_others(
    cloud: tuple[Cloud, str], set_desired_calls: list[tuple[str, int]]
) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=4, max_size=4)
    drop_instances(WORKERS, 2)  # two launches still outstanding
    assert run(fixture_record(LAUNCH, WORKERS, ids[0]))["outcomes"] == ["wait"]
    assert c.messages(queue) == []
    assert set_desired_calls == []
    assert c.desired(WORKERS) == 4


def test_one_of_four_launches_failing_lowers_desired_to_three(
    cloud: tuple[Cloud, str], set_desired_calls: list[tuple[str, int]]
) -> None:
    c, queue = cloud
    c.group(WORKERS, min_size=0, desired=4, max_size=4)
    drop_instances(WORKERS, 1)
    record = fixture_record(LAUNCH_ERROR, WORKERS)
    assert run(record)["outcomes"] == ["asg-setup-success"]

    assert c.desired(WORKERS) == 3
    assert set_desired_calls == [(WORKERS, 3)]
    [message] = c.messages(queue)
    assert message["status"] == "success"
    assert (message["desired"], message["launched"], len(message["instances"])) == (3, 3, 3)
    assert message["instances"] == c.instance_ids(WORKERS)
    assert "lowered from 4 to 3" in message["reason"]
    assert "sufficient p3.2xlarge capacity" in message["reason"]  # StatusMessage
    assert message["cause"] == json.loads(record["Sns"]["Message"])["Cause"]


def test_launch_error_below_minimum_reports_failure_without_change(
    cloud: tuple[Cloud, str], set_desired_calls: list[tuple[str, int]]
) -> None:
    c, queue = cloud
    c.group(WORKERS, min_size=2, desired=4, max_size=4)
    drop_instances(WORKERS, 3)
    assert run(fixture_record(LAUNCH_ERROR, WORKERS))["outcomes"] == ["asg-setup-failure"]
    [message] = c.messages(queue)
    assert message["status"] == "failure"
    assert (message["min"], message["desired"], message["launched"]) == (2, 4, 1)
    assert "minimum is 2" in message["reason"]
    assert "only 1 of 4" in message["reason"]
    assert set_desired_calls == []
    assert c.desired(WORKERS) == 4


def test_master_launch_error_fails_fast(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    c.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    drop_instances(MASTER, 1)
    run(fixture_record(LAUNCH_ERROR, MASTER))
    [message] = c.messages(queue)
    assert (message["status"], message["role"], message["launched"]) == ("failure", "master", 0)
    assert c.desired(MASTER) == 1


def test_all_workers_failing_with_minimum_zero_lowers_to_zero(cloud: tuple[Cloud, str]) -> None:
    """Seed 001's behaviour: the master also trains, so zero workers is still a cluster."""
    c, queue = cloud
    c.group(WORKERS, min_size=0, desired=2, max_size=2)
    drop_instances(WORKERS, 2)
    run(fixture_record(LAUNCH_ERROR, WORKERS))
    [message] = c.messages(queue)
    assert (message["status"], message["desired"], message["launched"]) == ("success", 0, 0)
    assert c.desired(WORKERS) == 0


def test_launch_error_never_raises_desired(
    cloud: tuple[Cloud, str], set_desired_calls: list[tuple[str, int]]
) -> None:
    """A stale launch error after the group healed: no change, success at desired."""
    c, queue = cloud
    c.group(WORKERS, min_size=0, desired=3, max_size=4)
    run(fixture_record(LAUNCH_ERROR, WORKERS))
    assert set_desired_calls == []
    [message] = c.messages(queue)
    assert (message["status"], message["desired"], message["launched"]) == ("success", 3, 3)


# --- instance states ------------------------------------------------------------------


def test_counts_only_healthy_in_service_or_pending(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=6, max_size=6)
    c.asg.set_instance_health(InstanceId=ids[3], HealthStatus="Unhealthy")  # not counted
    c.asg.enter_standby(  # not counted (moto's real API)
        AutoScalingGroupName=WORKERS, InstanceIds=[ids[4]], ShouldDecrementDesiredCapacity=True
    )
    # states moto cannot reach itself, set last so moto does not "fill" around them
    set_lifecycle_state(WORKERS, ids[0], "Pending")  # counted
    set_lifecycle_state(WORKERS, ids[1], "Pending:Wait")  # counted (launch hook)
    set_lifecycle_state(WORKERS, ids[2], "Terminating")  # not counted
    assert c.instance_ids(WORKERS) == ids  # no replacements were launched
    counted = sorted([ids[0], ids[1], ids[5]])
    snapshot = adjuster.snapshot_from_description(
        c.describe(WORKERS),
        cluster_id="DLClusterStack",
        cluster_tag_key="dl-cluster:id",
        role_tag_key="NodeType",
    )
    assert (snapshot.instances, snapshot.desired) == (tuple(counted), 5)
    # through the handler: 3 of 5 counted, so a plain launch waits for the others. (A launch
    # error would lower desired to 3; moto would then launch into the Pending slots, which
    # it does not count as capacity: a moto artifact, so this test stops at the count.)
    assert run(fixture_record(LAUNCH, WORKERS, ids[5]))["outcomes"] == ["wait"]
    assert c.messages(queue) == []


# --- terminate ------------------------------------------------------------------------


def test_terminate_reports_membership_change(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=3, max_size=4)
    c.asg.terminate_instance_in_auto_scaling_group(
        InstanceId=ids[1], ShouldDecrementDesiredCapacity=True
    )
    assert run(fixture_record(TERMINATE, WORKERS, ids[1]))["outcomes"] == ["membership-change"]
    [message] = c.messages(queue)
    assert message == {
        **message,
        "event": "membership-change",
        "change": "terminate",
        "asg": WORKERS,
        "role": "worker",
        "cluster_id": "DLClusterStack",
        "instance_id": ids[1],
        "desired": 2,
        "launched": 2,
    }
    assert set(message) == {
        "event", "change", "asg", "role", "cluster_id", "instance_id", "desired",
        "launched", "dedupe_key", "sent_at",
    }  # fmt: skip
    assert c.desired(WORKERS) == 2


def test_terminate_error_reports_membership_change(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=3, max_size=4)
    run(fixture_record(TERMINATE_ERROR, WORKERS, ids[0]))
    [message] = c.messages(queue)
    assert (message["change"], message["instance_id"], message["launched"]) == (
        "terminate-error", ids[0], 3,
    )  # fmt: skip


# --- test notification, other clusters, missing groups --------------------------------


def test_test_notification_is_logged_and_ignored(
    cloud: tuple[Cloud, str], capsys: pytest.CaptureFixture[str]
) -> None:
    c, queue = cloud
    # the group does not even exist: a test notification must not trigger any AWS call
    result = run(fixture_record(TEST_NOTIFICATION, "no-such-group"))
    assert result["outcomes"] == ["test-notification"]
    assert c.messages(queue) == []
    lines = log_lines(capsys.readouterr().out)
    assert any(line.get("reason") == "test-notification" for line in lines)


@pytest.mark.parametrize(
    ("name", "cluster_id", "role"),
    [
        ("OtherStack-WorkerGroupASG-CCCC", "OtherStack", "Worker"),  # another cluster
        ("DLClusterStack-WorkerGroupASG-untagged", None, "Worker"),  # name matches, no tag
        ("DLClusterStack-WorkerGroupASG-norole", "DLClusterStack", None),  # no role tag
        ("DLClusterStack-WorkerGroupASG-badrole", "DLClusterStack", "Bastion"),
    ],
)
def test_groups_not_ours_are_ignored(
    cloud: tuple[Cloud, str],
    set_desired_calls: list[tuple[str, int]],
    name: str,
    cluster_id: str | None,
    role: str | None,
) -> None:
    c, queue = cloud
    c.group(name, min_size=0, desired=4, max_size=4, cluster_id=cluster_id, role=role)
    drop_instances(name, 1)
    assert run(fixture_record(LAUNCH_ERROR, name))["outcomes"] == ["ignored-group"]
    assert set_desired_calls == []
    assert c.desired(name) == 4
    assert c.messages(queue) == []


def test_one_bad_record_does_not_stop_the_others(
    cloud: tuple[Cloud, str], capsys: pytest.CaptureFixture[str]
) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=2, max_size=2)
    garbage = {"EventSource": "aws:sns", "Sns": {"Message": "{not json"}}
    result = run(
        garbage,
        fixture_record(LAUNCH, "DLClusterStack-deleted-group", ids[0]),
        "not even a record",  # type: ignore[arg-type]
        fixture_record(LAUNCH, WORKERS, ids[0]),
    )
    assert result["outcomes"] == ["malformed", "group-not-found", "malformed", "asg-setup-success"]
    assert [m["event"] for m in c.messages(queue)] == ["asg-setup"]
    lines = log_lines(capsys.readouterr().out)  # every line is one JSON object
    skipped = [line for line in lines if line["msg"] == "record-skipped"]
    assert [line["record"] for line in skipped] == [0, 1, 2]
    assert all(line["logger"] == "capacity_adjuster" for line in lines)


# --- duplicates and re-ordering -------------------------------------------------------


def test_duplicate_launch_error_gives_same_key_and_no_second_change(
    cloud: tuple[Cloud, str], set_desired_calls: list[tuple[str, int]]
) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=4, max_size=4)
    drop_instances(WORKERS, 1)
    record = fixture_record(LAUNCH_ERROR, WORKERS)
    run(record)
    run(record)  # SNS delivered it twice
    run(fixture_record(LAUNCH, WORKERS, ids[0]))  # a late launch notification
    first, second, third = c.messages(queue)
    assert first["dedupe_key"] == second["dedupe_key"] == third["dedupe_key"]
    assert set_desired_calls == [(WORKERS, 3)]
    assert c.desired(WORKERS) == 3


def test_duplicate_terminate_gives_same_key(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=3, max_size=4)
    c.asg.terminate_instance_in_auto_scaling_group(
        InstanceId=ids[2], ShouldDecrementDesiredCapacity=True
    )
    record = fixture_record(TERMINATE, WORKERS, ids[2])
    run(record, record)
    first, second = c.messages(queue)
    assert first["dedupe_key"] == second["dedupe_key"]


def test_different_state_gives_different_key(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=3, max_size=4)
    run(fixture_record(LAUNCH, WORKERS, ids[0]))
    c.asg.terminate_instance_in_auto_scaling_group(
        InstanceId=ids[0], ShouldDecrementDesiredCapacity=False
    )  # moto launches a replacement at once
    run(fixture_record(LAUNCH, WORKERS, c.instance_ids(WORKERS)[0]))
    first, second = c.messages(queue)
    assert first["instances"] != second["instances"]
    assert first["dedupe_key"] != second["dedupe_key"]


# --- configuration and failures -------------------------------------------------------


def test_missing_environment_is_logged_not_raised(
    cloud: tuple[Cloud, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("MASTER_QUEUE_URL")
    monkeypatch.setenv("CLUSTER_ID", "  ")
    result = run(fixture_record(LAUNCH, WORKERS))
    assert "MASTER_QUEUE_URL" in result["error"]
    [line] = [x for x in log_lines(capsys.readouterr().out) if x["msg"] == "config-error"]
    assert "MASTER_QUEUE_URL" in line["detail"]
    assert "CLUSTER_ID" in line["detail"]


def test_bad_log_level_is_a_warning(
    cloud: tuple[Cloud, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("LOG_LEVEL", "LOUD")
    run(fixture_record(TEST_NOTIFICATION, WORKERS))
    lines = log_lines(capsys.readouterr().out)
    assert any("LOUD" in line.get("detail", "") for line in lines)


def test_sqs_failure_raises_after_other_records(
    cloud: tuple[Cloud, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _ = cloud
    ids = c.group(WORKERS, min_size=0, desired=3, max_size=4)
    drop_instances(WORKERS, 1)
    other_queue = c.queue("elsewhere")
    monkeypatch.setenv("MASTER_QUEUE_URL", other_queue.replace("elsewhere", "gone"))
    with pytest.raises(adjuster.RetryableFailure, match="SendMessage"):
        run(fixture_record(LAUNCH_ERROR, WORKERS), fixture_record(LAUNCH, WORKERS, ids[0]))
    # the capacity change still happened; the retry will find the group at desired and
    # send the same message (same dedupe key)
    assert c.desired(WORKERS) == 2


def _client_error(code: str, status: int, operation: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "injected"},
         "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )  # fmt: skip


class _FailingAutoscaling:
    """Wraps the real client; DescribeAutoScalingGroups fails for the named groups."""

    def __init__(self, real: Any, failures: dict[str, tuple[str, int]]) -> None:
        self._real, self._failures = real, failures

    def describe_auto_scaling_groups(self, **kwargs: Any) -> Any:
        [name] = kwargs["AutoScalingGroupNames"]
        if name in self._failures:
            raise _client_error(*self._failures[name], "DescribeAutoScalingGroups")
        return self._real.describe_auto_scaling_groups(**kwargs)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._real, attribute)


def _inject_failures(monkeypatch: pytest.MonkeyPatch, failures: dict[str, tuple[str, int]]) -> None:
    real_factory = adjuster.AwsClients.from_environment

    def factory() -> Any:
        real = real_factory()  # cached and shared: wrap, never mutate
        return adjuster.AwsClients(_FailingAutoscaling(real.autoscaling, failures), real.sqs)

    monkeypatch.setattr(adjuster.AwsClients, "from_environment", staticmethod(factory))


def test_throttling_is_retryable_but_other_records_are_processed(
    cloud: tuple[Cloud, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=2, max_size=2)
    _inject_failures(monkeypatch, {"throttled-group": ("Throttling", 400)})
    with pytest.raises(adjuster.RetryableFailure, match="Throttling"):
        run(fixture_record(LAUNCH, "throttled-group"), fixture_record(LAUNCH, WORKERS, ids[0]))
    assert [m["status"] for m in c.messages(queue)] == ["success"]


def test_access_denied_is_logged_not_retried(
    cloud: tuple[Cloud, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=2, max_size=2)
    _inject_failures(monkeypatch, {"denied-group": ("AccessDenied", 403)})
    result = run(fixture_record(LAUNCH, "denied-group"), fixture_record(LAUNCH, WORKERS, ids[0]))
    assert result["outcomes"] == ["aws-error", "asg-setup-success"]
    assert len(c.messages(queue)) == 1


def test_aws_error_classification() -> None:
    aws_calls = adjuster.RetryableFailure.__module__
    module = sys.modules[aws_calls]
    for code, status, retryable in [
        ("Throttling", 400, True),
        ("RequestLimitExceeded", 400, True),
        ("ServiceUnavailable", 503, True),
        ("Anything", 500, True),
        ("ValidationError", 400, False),
        ("AccessDenied", 403, False),
    ]:
        exc = ClientError(
            {"Error": {"Code": code, "Message": "x"},
             "ResponseMetadata": {"HTTPStatusCode": status}},
            "Op",
        )  # fmt: skip
        classified = module._classify("op", exc)
        assert isinstance(classified, module.RetryableFailure) is retryable, code


# --- packaging: the asset directory works on its own ----------------------------------


def test_handler_imports_as_lambda_would() -> None:
    """Lambda puts the asset root (lambda_src/) on sys.path and imports capacity_adjuster."""
    code = (
        "import sys; sys.path.insert(0, 'lambda_src'); import capacity_adjuster as m; "
        "assert callable(m.handler); "
        "assert not any(n.startswith(('aws_cdk', 'constructs', 'bootstrap_scripts', "
        "'lambda_src')) for n in sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-I", "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


def test_asset_has_no_project_or_cdk_imports() -> None:
    for path in (REPO_ROOT / "lambda_src").glob("*.py"):
        text = path.read_text()
        for forbidden in ("aws_cdk", "constructs_lib", "bootstrap_scripts", "stacks."):
            assert forbidden not in text, f"{path.name} mentions {forbidden}"


def test_request_id_is_on_every_line(
    cloud: tuple[Cloud, str], capsys: pytest.CaptureFixture[str]
) -> None:
    class Context:
        aws_request_id = "8f5e2a1c-0000-4000-8000-000000000001"

    adjuster.handler(sns_event(fixture_record(TEST_NOTIFICATION, WORKERS)), Context())
    lines = log_lines(capsys.readouterr().out)
    assert lines
    assert all(line["request_id"] == Context.aws_request_id for line in lines)


def test_no_region_is_a_config_error_not_a_crash(
    cloud: tuple[Cloud, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    result = run(fixture_record(LAUNCH, WORKERS))
    assert "Region" in result["error"]


# --- lifecycle hook (drain) ----------------------------------------------------------------


def test_lifecycle_fixture_has_real_shape() -> None:
    record = load_fixture("lifecycle_terminating.json")["Records"][0]
    message = json.loads(record["Sns"]["Message"])
    assert set(message) == {
        "Origin", "Destination", "LifecycleHookName", "AccountId", "RequestId",
        "LifecycleTransition", "AutoScalingGroupName", "Service", "Time", "EC2InstanceId",
        "LifecycleActionToken",
    }  # fmt: skip
    assert "Event" not in message  # lifecycle notifications carry a transition, not an Event
    parsed = adjuster.notes.parse_record(record)
    assert parsed.is_lifecycle and not parsed.is_test
    assert (parsed.lifecycle_hook, parsed.lifecycle_action_token) == (
        "drain", message["LifecycleActionToken"],
    )  # fmt: skip


def test_terminating_hook_becomes_drain_request(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=3, max_size=4)
    result = run(lifecycle_record(WORKERS, ids[1], token="0b1c2d3e-aaaa-4bbb-8ccc-123456789abc"))
    assert result["outcomes"] == ["drain-request"]
    [message] = c.messages(queue)
    assert message == {
        "event": "drain-request", "asg": WORKERS, "role": "worker",
        "cluster_id": "DLClusterStack", "instance_id": ids[1], "lifecycle_hook": "drain",
        "lifecycle_action_token": "0b1c2d3e-aaaa-4bbb-8ccc-123456789abc",
        "dedupe_key": message["dedupe_key"], "sent_at": message["sent_at"],
    }  # fmt: skip
    assert len(message["dedupe_key"]) == 32
    assert c.desired(WORKERS) == 3  # a drain never changes capacity


def test_duplicate_lifecycle_notification_gives_the_same_key(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=2, max_size=4)
    run(lifecycle_record(WORKERS, ids[0]), lifecycle_record(WORKERS, ids[0]))
    run(lifecycle_record(WORKERS, ids[0], token="99999999-9999-4999-8999-999999999999"))
    first, again, other = c.messages(queue)
    assert first["dedupe_key"] == again["dedupe_key"]
    assert other["dedupe_key"] != first["dedupe_key"]  # another lifecycle action


def test_lifecycle_notification_of_another_cluster_is_ignored(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group("Other-Workers", min_size=0, desired=1, max_size=2, cluster_id="Other")
    assert run(lifecycle_record("Other-Workers", ids[0]))["outcomes"] == ["ignored-group"]
    assert c.messages(queue) == []


def test_launching_hook_and_hook_test_notification_are_skipped(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=1, max_size=2)
    launching = lifecycle_record(WORKERS, ids[0])
    message = json.loads(launching["Sns"]["Message"])
    message["LifecycleTransition"] = "autoscaling:EC2_INSTANCE_LAUNCHING"
    launching["Sns"]["Message"] = json.dumps(message)
    # creating the hook sends autoscaling:TEST_NOTIFICATION to the topic (same shape)
    result = run(launching, fixture_record(TEST_NOTIFICATION, WORKERS))
    assert result["outcomes"] == ["ignored-launch-hook", "test-notification"]
    assert c.messages(queue) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("LifecycleActionToken", ""),
        ("LifecycleActionToken", "not a token; rm -rf"),
        ("LifecycleHookName", "drain hook"),
        ("EC2InstanceId", ""),
        ("LifecycleTransition", "autoscaling:EC2_INSTANCE_EXPLODING"),
    ],
)
def test_malformed_lifecycle_notification_is_skipped(
    cloud: tuple[Cloud, str], field: str, value: str
) -> None:
    c, queue = cloud
    ids = c.group(WORKERS, min_size=0, desired=1, max_size=2)
    record = lifecycle_record(WORKERS, ids[0])
    message = json.loads(record["Sns"]["Message"])
    message[field] = value
    record["Sns"]["Message"] = json.dumps(message)
    assert run(record)["outcomes"] == ["malformed"]
    assert c.messages(queue) == []

"""Launch errors by cause: the classification as a table, the retry window as a table, and
the handler in moto: a transient error waits for the group's own retries, a configuration
error is final at once, and a master that cannot launch fails the wait condition itself."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from adjuster_harness import (
    LAUNCH_ERROR,
    Cloud,
    backend_group,
    drop_instances,
    fixture_record,
    import_adjuster,
    lambda_environment,
    sns_event,
)
from moto import mock_aws

from emulator.wait_handle import WaitHandle
from lambda_src import launch_errors as le
from lambda_src import setup_signal

adjuster = import_adjuster()
WORKERS = "DLClusterStack-WorkerGroupASG-AAAA"
MASTER = "DLClusterStack-MasterGroupASG-BBBB"

ICE = ("We currently do not have sufficient p5.48xlarge capacity in the Availability Zone you "
       "requested (us-east-1a). Our system will be working on provisioning additional "
       "capacity. Launching EC2 instance failed.")
ICE_MIXED = ("Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently "
             "do not have sufficient p4d.24xlarge capacity in the Availability Zone you "
             "requested (us-east-1b). Launching EC2 instance failed.")
THROTTLED = "Request limit exceeded. Launching EC2 instance failed."
VCPU = ("You have requested more vCPU capacity than your current vCPU limit of 32 allows for "
        "the instance bucket that the specified instance type belongs to. Please visit "
        "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit. "
        "Launching EC2 instance failed.")
VCPU_MIXED = "Could not launch On-Demand Instances. VcpuLimitExceeded - You have requested more"
INSTANCES = ("You have requested more instances (21) than your current instance limit of 20 "
             "allows for the specified instance type. Launching EC2 instance failed.")
AMI = "The image id '[ami-0123456789abcdef0]' does not exist. Launching EC2 instance failed."
PARAM = ("Could not launch On-Demand Instances. InvalidParameterCombination - The requested "
         "configuration is currently not supported. Please check the documentation.")
UNSUPPORTED = ("Your requested instance type (p5.48xlarge) is not supported in your requested "
               "Availability Zone (us-east-1e). Launching EC2 instance failed.")
UNSUPPORTED_MIXED = "Could not launch On-Demand Instances. Unsupported - The requested config"


@pytest.mark.parametrize(("text", "kind", "code"), [
    (ICE, le.TRANSIENT, "InsufficientInstanceCapacity"),
    (ICE_MIXED, le.TRANSIENT, "InsufficientInstanceCapacity"),
    (THROTTLED, le.TRANSIENT, "RequestLimitExceeded"),
    ("Could not launch Spot Instances. RequestLimitExceeded - Request limit exceeded.",
     le.TRANSIENT, "RequestLimitExceeded"),
    (VCPU, le.FINAL, "VcpuLimitExceeded"),
    (VCPU_MIXED, le.FINAL, "VcpuLimitExceeded"),
    (INSTANCES, le.FINAL, "InstanceLimitExceeded"),
    (AMI, le.FINAL, "InvalidAMIID.NotFound"),
    ("Could not launch On-Demand Instances. InvalidAMIID.NotFound - The image id does not "
     "exist", le.FINAL, "InvalidAMIID.NotFound"),
    (PARAM, le.FINAL, "InvalidParameterCombination"),
    (UNSUPPORTED, le.FINAL, "Unsupported"),
    (UNSUPPORTED_MIXED, le.FINAL, "Unsupported"),
    ("Something EC2 has never said before.", le.UNKNOWN, ""),
    ("", le.UNKNOWN, ""),
])
def test_classify(text: str, kind: str, code: str) -> None:
    error = le.classify(text)
    assert (error.kind, error.code) == (kind, code)
    assert error.retryable == (kind != le.FINAL)


@pytest.mark.parametrize(("case", "text", "since", "window", "left"), [
    ("transient, early", ICE, 1000.0, 600.0, 500.0),
    ("transient, window over", ICE, 1000.0, 600.0, 0.0),
    ("unknown, early", "odd", 1000.0, 600.0, 500.0),
    ("final, early", AMI, 1000.0, 600.0, 0.0),
    ("no window", ICE, 1000.0, 0.0, 0.0),
    ("creation time unknown", ICE, None, 600.0, 0.0),
])
def test_retry_seconds_left(case: str, text: str, since: float | None, window: float,
                            left: float) -> None:
    now = 1100.0 if "early" in case else 1700.0
    got = le.retry_seconds_left(le.classify(text), failing_since=since, now=now, window=window)
    assert got == left, case


def test_created_at_reads_aware_naive_and_text_times() -> None:
    aware = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert setup_signal.created_at({"CreatedTime": aware}) == aware.timestamp()
    assert setup_signal.created_at({"CreatedTime": aware.replace(tzinfo=None)}) == \
        aware.timestamp()
    assert setup_signal.created_at({"CreatedTime": "2026-01-01T00:00:00Z"}) == aware.timestamp()
    assert setup_signal.created_at({}) is None
    assert setup_signal.created_at({"CreatedTime": "yesterday"}) is None


# -- the handler in moto -----------------------------------------------------------------------


@pytest.fixture()
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cloud, str]]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        c = Cloud()
        queue_url = c.queue()
        lambda_environment(monkeypatch, queue_url, LAUNCH_RETRY_SECONDS="600")
        yield c, queue_url


def error_record(group: str, text: str) -> dict[str, Any]:
    record = fixture_record(LAUNCH_ERROR, group)
    message = json.loads(record["Sns"]["Message"])
    message["StatusMessage"] = text
    record["Sns"]["Message"] = json.dumps(message)
    return record


def run(*records: dict[str, Any]) -> dict[str, Any]:
    return adjuster.handler(sns_event(*records), None)


def age(group: str, seconds: float) -> None:
    """The group was created ``seconds`` ago (its retries have run that long)."""
    then = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    backend_group(group).created_time = then.isoformat()


def test_transient_error_is_left_to_the_groups_retries(cloud: tuple[Cloud, str],
                                                       capsys: pytest.CaptureFixture) -> None:
    c, queue = cloud
    c.group(WORKERS, min_size=1, desired=4, max_size=4)
    drop_instances(WORKERS, 1)
    assert run(error_record(WORKERS, ICE))["outcomes"] == ["retry"]
    assert c.desired(WORKERS) == 4
    assert c.messages(queue) == []
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    [decision] = [x for x in lines if x["msg"] == "decision"]
    assert (decision["action"], decision["error_code"]) == ("retry", "InsufficientInstanceCapacity")


def test_transient_error_after_the_window_lowers(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    c.group(WORKERS, min_size=1, desired=4, max_size=4)
    drop_instances(WORKERS, 1)
    age(WORKERS, 601)
    assert run(error_record(WORKERS, ICE))["outcomes"] == ["asg-setup-success"]
    assert c.desired(WORKERS) == 3
    [message] = c.messages(queue)
    assert "retried for 600 s" in message["reason"]


def test_configuration_error_is_final_at_once(cloud: tuple[Cloud, str]) -> None:
    c, queue = cloud
    c.group(WORKERS, min_size=1, desired=4, max_size=4)
    drop_instances(WORKERS, 1)
    assert run(error_record(WORKERS, AMI))["outcomes"] == ["asg-setup-success"]
    assert c.desired(WORKERS) == 3
    [message] = c.messages(queue)
    assert "InvalidAMIID.NotFound: a configuration or quota error" in message["reason"]
    assert AMI in message["reason"]


def test_a_vcpu_quota_is_final_at_once_and_names_the_quota_to_raise(
        cloud: tuple[Cloud, str]) -> None:
    """Inside the retry window (a capacity error would wait): lowered at once, EC2's message
    in the reason with the quota of the group's type (t3.micro: Standard) and the command."""
    c, queue = cloud
    c.group(WORKERS, min_size=1, desired=4, max_size=4)
    drop_instances(WORKERS, 1)
    assert run(error_record(WORKERS, VCPU))["outcomes"] == ["asg-setup-success"]
    assert c.desired(WORKERS) == 3
    [message] = c.messages(queue)
    reason = message["reason"]
    assert VCPU in reason and "VcpuLimitExceeded: the account's vCPU quota" in reason
    assert ("next step: request an increase of the account's 'Running On-Demand Standard "
            "(A, C, D, H, I, M, R, T, Z) instances' (L-1216C47A) vCPU quota") in reason
    assert ("aws service-quotas request-service-quota-increase --service-code ec2 "
            "--quota-code L-1216C47A --desired-value VCPUS") in reason


def test_the_emulators_refused_launch_reaches_the_function_as_final(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end in moto: a new account (5 vCPUs of Standard) and a group of four
    t3.micro (2 vCPUs each). ``emulator.vcpu_quotas`` launches two and refuses the others;
    the launch error it publishes, handed to the function as SNS delivers it, is final at
    once: the group is lowered to what launched, the reason names the Standard quota."""
    from moto.autoscaling.models import FakeAutoScalingGroup
    from moto.ec2.models.instances import InstanceBackend

    from emulator import capacity, service_quotas, vcpu_quotas
    from emulator import notifications as nt

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    monkeypatch.setattr(capacity, "RETRY_SECONDS", 1e6)  # no retry during the test
    service_quotas.install()
    for (cls, name), method in vcpu_quotas.patches(FakeAutoScalingGroup,
                                                   InstanceBackend).items():
        monkeypatch.setattr(cls, name, method)
    with mock_aws():
        c = Cloud(operator=False)
        queue = c.queue()
        lambda_environment(monkeypatch, queue, LAUNCH_RETRY_SECONDS="600")
        assert len(c.group(WORKERS, min_size=1, desired=4, max_size=4)) == 2
        refused = backend_group(WORKERS).__dict__.get("emulator_pending_errors", [])
        assert len(refused) == 2  # published once the group's notifications exist
        message = refused[0]
        assert "current vCPU limit of 5 allows" in message["StatusMessage"]
        event = nt.sns_event("arn:aws:sns:us-east-1:123456789012:topic", message)
        assert adjuster.handler(event, None)["outcomes"] == ["asg-setup-success"]
        assert c.desired(WORKERS) == 2
        [sent] = c.messages(queue)
        assert message["StatusMessage"] in sent["reason"] and "L-1216C47A" in sent["reason"]
    capacity.reset()


@pytest.mark.parametrize(("types", "codes"), [
    (("g5.xlarge", "g6.xlarge"), ["L-DB2E81BA"]),
    (("p5.48xlarge", "g5.48xlarge"), ["L-417A185B", "L-DB2E81BA"]),
    (("u-6tb1.metal",), []),
    ((), []),
])
def test_the_next_step_names_each_quota_of_the_groups_types(types: tuple[str, ...],
                                                            codes: list[str]) -> None:
    step = le.classify(VCPU).describe(600, types)
    assert step.startswith("VcpuLimitExceeded: the account's vCPU quota, retries cannot fix "
                           "it; next step: request an increase")
    assert sorted(c for c in ("L-1216C47A", "L-DB2E81BA", "L-417A185B") if c in step) == \
        sorted(codes)
    if not codes:  # no type known: how to find the quota
        assert "aws service-quotas list-service-quotas --service-code ec2" in step
    assert le.classify(AMI).describe(600, types).endswith("retries cannot fix it")


@pytest.fixture()
def handle() -> Iterator[WaitHandle]:
    h = WaitHandle()
    yield h
    h.stop()


def test_master_that_cannot_launch_fails_the_wait_condition(
        cloud: tuple[Cloud, str], handle: WaitHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    c, queue = cloud
    monkeypatch.setenv("WAIT_HANDLE_URL", handle.url)
    c.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    drop_instances(MASTER, 1)
    assert run(error_record(MASTER, ICE))["outcomes"] == ["retry"]  # its own retries first
    assert handle.signals == []
    age(MASTER, 700)
    assert run(error_record(MASTER, ICE))["outcomes"] == ["asg-setup-failure"]
    [signal] = handle.signals
    assert (signal["Status"], signal["UniqueId"]) == ("FAILURE", "capacity-adjuster")
    reason = signal["Reason"]
    assert reason.startswith(f"master group {MASTER}: cannot reach its minimum")
    assert "p5.48xlarge" in reason and "us-east-1a" in reason
    assert "InsufficientInstanceCapacity" in reason
    assert reason.endswith("the group's zones: us-east-1a")
    assert handle.headers[0].get("Content-Type", "") == ""
    [message] = c.messages(queue)  # the queue still has it, for a master that comes later
    assert message["status"] == "failure"


def test_master_configuration_error_signals_at_once(
        cloud: tuple[Cloud, str], handle: WaitHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    c, _queue = cloud
    monkeypatch.setenv("WAIT_HANDLE_URL", handle.url)
    c.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    drop_instances(MASTER, 1)
    assert run(error_record(MASTER, VCPU))["outcomes"] == ["asg-setup-failure"]
    [signal] = handle.signals
    assert "VcpuLimitExceeded" in signal["Reason"] and "vCPU limit of 32" in signal["Reason"]
    # no master launched: its type is not known to the function, the step says how to find it
    assert "next step: request an increase of the EC2 vCPU quota" in signal["Reason"]


def test_a_worker_group_below_its_minimum_for_the_quota_fails_the_setup_with_the_step(
        cloud: tuple[Cloud, str]) -> None:
    """The master agent's wait-condition reason for a worker group that cannot reach its
    minimum (``launches.setup_failure_reason``, what the stack's failure shows) carries the
    adjuster's reason: EC2's message and the next step with the quota of the group's type."""
    from bootstrap_scripts.protocol import launches
    from bootstrap_scripts.protocol.messages import parse_message

    c, queue = cloud
    c.group(WORKERS, min_size=2, desired=3, max_size=3)
    drop_instances(WORKERS, 2)
    assert run(error_record(WORKERS, VCPU))["outcomes"] == ["asg-setup-failure"]
    [body] = c.messages(queue)
    reason = launches.setup_failure_reason(parse_message(json.dumps(body)))
    assert reason.startswith(f"worker group {WORKERS}: ")
    assert "vCPU limit of 32" in reason and "next step: request an increase" in reason
    assert "--quota-code L-1216C47A" in reason


def test_worker_failure_is_left_to_the_master_agent(
        cloud: tuple[Cloud, str], handle: WaitHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    c, queue = cloud
    monkeypatch.setenv("WAIT_HANDLE_URL", handle.url)
    c.group(WORKERS, min_size=2, desired=2, max_size=2)
    drop_instances(WORKERS, 2)
    assert run(error_record(WORKERS, AMI))["outcomes"] == ["asg-setup-failure"]
    assert handle.signals == []
    assert c.messages(queue)[0]["status"] == "failure"


def test_no_signal_once_the_cluster_formed(
        cloud: tuple[Cloud, str], handle: WaitHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    c, _queue = cloud
    monkeypatch.setenv("WAIT_HANDLE_URL", handle.url)
    [worker] = c.group(WORKERS, min_size=1, desired=1, max_size=1)
    c.asg.set_instance_protection(InstanceIds=[worker], AutoScalingGroupName=WORKERS,
                                  ProtectedFromScaleIn=True)  # what formation does
    c.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    drop_instances(MASTER, 1)
    assert run(error_record(MASTER, AMI))["outcomes"] == ["asg-setup-failure"]
    assert handle.signals == []


def test_the_demos_failed_launch_is_final(cloud: tuple[Cloud, str]) -> None:
    """``--fail-launches`` plays launches that fail for good (the vCPU quota): the Lambda
    lowers at once, even inside the retry window, so the cluster forms without them."""
    from emulator import notifications as nt

    c, _queue = cloud
    c.group(WORKERS, min_size=1, desired=3, max_size=3)
    drop_instances(WORKERS, 1)
    message = nt.notification(nt.LAUNCH_ERROR, WORKERS, desired=3, instance_type="g5.xlarge",
                              status_message=nt.VCPU_LIMIT.format(limit=12))
    event = nt.sns_event("arn:aws:sns:us-east-1:123456789012:topic", message)
    assert adjuster.handler(event, None)["outcomes"] == ["asg-setup-success"]
    assert c.desired(WORKERS) == 2

"""The agent and a warm pool (``bootstrap_scripts.agent.warm_pool``): it holds while its
instance's target lifecycle state is ``Warmed:*`` (completing the launch hook once, so Auto
Scaling stops the prepared instance), never registers meanwhile, and joins once the state is
``InService`` (completing the hook again, now for ``Pending:Wait``)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from bootstrap_scripts.agent import warm_pool, warm_ready
from bootstrap_scripts.agent.identity import NodeIdentity, read_metadata
from bootstrap_scripts.agent.node_agent import NodeAgent
from bootstrap_scripts.agent.settings import AgentConfig
from bootstrap_scripts.protocol.paths import ClusterPaths
from emulator.imds import MetadataServer
from tests.support.agents import wait_until

log = logging.getLogger("test-warm-pool")


@pytest.mark.parametrize(("target", "step"), [
    ("Warmed:Stopped", warm_pool.Step.HOLD), ("Warmed:Running", warm_pool.Step.HOLD),
    ("Warmed:Hibernated", warm_pool.Step.HOLD), ("InService", warm_pool.Step.JOIN),
    (None, warm_pool.Step.JOIN), ("Standby", warm_pool.Step.JOIN),
    ("Warmed:Terminated", warm_pool.Step.LEAVE), ("Terminated", warm_pool.Step.LEAVE),
])
def test_the_decision_table(target, step) -> None:
    assert warm_pool.decide(target) is step


def _run(states: list[str | None], stop: threading.Event | None = None):
    """await_service over a scripted sequence of target states; (result, completions,
    reads)."""
    stop = stop or threading.Event()
    seq = iter(states)
    reads: list[str | None] = []
    completions: list[str | None] = []

    def read():
        reads.append(next(seq))
        return reads[-1]

    def complete():
        completions.append(reads[-1])
        return "completed"

    result = warm_pool.await_service(read, complete, stop=stop, log=log, poll=5.0,
                                     sleep=lambda _s: stop.is_set())
    return result, completions, reads


def test_waits_while_warmed_and_joins_on_in_service() -> None:
    result, completions, reads = _run(["Warmed:Stopped"] * 4 + ["InService"])
    assert result is True
    assert len(reads) == 5
    # once for Warmed:Pending:Wait (then Auto Scaling stops it), once for Pending:Wait
    assert completions == ["Warmed:Stopped", "InService"]


def test_a_cold_launch_completes_its_hook_and_joins_at_once() -> None:
    assert _run(["InService"]) == (True, ["InService"], ["InService"])


def test_leaving_the_pool_never_joins() -> None:
    result, completions, _ = _run(["Warmed:Stopped", "Warmed:Terminated"])
    assert result is False and completions == ["Warmed:Stopped"]


def test_a_stop_while_held_returns_without_joining() -> None:
    stop = threading.Event()
    stop.set()
    result, completions, _ = _run(["Warmed:Stopped", "InService"], stop)
    assert result is False and completions == ["Warmed:Stopped"]


def test_an_unreadable_state_is_retried() -> None:
    calls = iter([OSError("refused"), "InService"])

    def read():
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    stop = threading.Event()
    assert warm_pool.await_service(read, lambda: "completed", stop=stop, log=log, poll=1,
                                   sleep=lambda _s: False) is True


def test_a_failing_completion_is_retried_then_left_to_the_hook_timeout() -> None:
    attempts: list[int] = []

    def complete():
        attempts.append(1)
        raise RuntimeError("throttled")

    stop = threading.Event()
    original = stop.wait
    stop.wait = lambda _s: False  # type: ignore[method-assign]
    try:
        assert warm_pool.complete_with_retries(complete, log, stop, attempts=3) == "failed"
    finally:
        stop.wait = original  # type: ignore[method-assign]
    assert len(attempts) == 3


def _stubbed_completer(error: str | None = None):
    client = boto3.client("autoscaling", region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [{
        "AutoScalingGroupName": "workers", "MinSize": 0, "MaxSize": 4, "DesiredCapacity": 2,
        "DefaultCooldown": 300, "AvailabilityZones": ["us-east-1a"], "HealthCheckType": "EC2",
        "CreatedTime": "2026-01-01T00:00:00Z"}]}, {"Filters": [
            {"Name": "tag:dl-cluster:id", "Values": ["c1"]},
            {"Name": "tag:NodeType", "Values": ["Worker"]}]})
    expected = {"LifecycleHookName": "warm-launch", "AutoScalingGroupName": "workers",
                "InstanceId": "i-1", "LifecycleActionResult": "CONTINUE"}
    if error:
        stub.add_client_error("complete_lifecycle_action", "ValidationError", error,
                              expected_params=expected)
    else:
        stub.add_response("complete_lifecycle_action", {}, expected)
    stub.activate()
    return warm_ready.completer(client, cluster_id="c1", hook_name="warm-launch"), stub


def test_the_master_completes_the_action_on_the_clusters_worker_group() -> None:
    complete, stub = _stubbed_completer()
    assert complete("i-1") == "completed"
    stub.assert_no_pending_responses()


def test_no_waiting_action_is_not_an_error() -> None:
    complete, _ = _stubbed_completer("No active Lifecycle Action found with instance ID i-1")
    assert complete("i-1") == "none-waiting"


WORKER_ROLE = "AROAABCDEFGHIJKLMNOPQ"


@pytest.mark.parametrize(("sender", "instance", "why"), [
    (f"{WORKER_ROLE}:i-0123456789abcdef0", "i-0123456789abcdef0", ""),
    ("AROAZZZZZZZZZZZZZZZZZ:i-0123456789abcdef0", None, "not a session of the workers' role"),
    (f"{WORKER_ROLE}:botocore-session-1", None, "not an instance's role session"),
    (f"{WORKER_ROLE}:i-1/../i-2", None, "not an instance's role session"),
    ("AIDAIT2UOQQY3AUEKVGXU", None, "not a session of the workers' role"),
    ("", None, "not a session of the workers' role"),
])
def test_a_ready_message_speaks_only_for_the_instance_that_signed_it(sender, instance, why):
    got, reason = warm_ready.instance_of_sender(sender, WORKER_ROLE)
    assert got == instance and why in reason


def test_no_configured_workers_role_believes_nobody() -> None:
    got, reason = warm_ready.instance_of_sender(f"{WORKER_ROLE}:i-0123456789abcdef0", "")
    assert got is None and "workers' role ID" in reason


class _Queue:
    """receive_message / delete_message of one batch, as SQS answers them."""

    def __init__(self, messages: list[dict]) -> None:
        self.messages = messages
        self.deleted: list[str] = []
        self.asked: dict = {}

    def receive_message(self, **kw):
        self.asked = kw
        out, self.messages = self.messages, []
        return {"Messages": out}

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> None:
        self.deleted.append(ReceiptHandle)


def test_the_master_completes_the_senders_instance_never_the_bodys(caplog) -> None:
    """A worker's root that names another instance in the body completes only its own; a
    sender outside the workers' role completes nothing; both messages are deleted."""
    own = "i-0aaaaaaaaaaaaaaa1"
    queue = _Queue([
        {"ReceiptHandle": "r1", "Body": '{"instance": "i-0bbbbbbbbbbbbbbb2"}',
         "Attributes": {"SenderId": f"{WORKER_ROLE}:{own}"}},
        {"ReceiptHandle": "r2", "Body": "{}",
         "Attributes": {"SenderId": "AROAOTHERROLE0000000X:i-0ccccccccccccccc3"}},
    ])
    completed: list[str] = []
    server = warm_ready.ReadyServer(queue_url="q", worker_role_id=WORKER_ROLE, sqs=queue,
                                    complete=lambda i: completed.append(i) or "completed",
                                    log=logging.getLogger("t"), stop=threading.Event())
    assert server.serve_once(wait=0) == 2
    assert completed == [own]
    assert queue.deleted == ["r1", "r2"]
    assert queue.asked["MessageSystemAttributeNames"] == ["SenderId"]


def test_a_failed_completion_leaves_the_message_for_another_receive() -> None:
    queue = _Queue([{"ReceiptHandle": "r1", "Body": "{}",
                     "Attributes": {"SenderId": f"{WORKER_ROLE}:i-0aaaaaaaaaaaaaaa1"}}])

    def fail(_instance: str) -> str:
        raise RuntimeError("throttled")

    server = warm_ready.ReadyServer(queue_url="q", worker_role_id=WORKER_ROLE, sqs=queue,
                                    complete=fail, log=logging.getLogger("t"),
                                    stop=threading.Event())
    assert server.serve_once(wait=0) == 0 and queue.deleted == []


def test_the_emulated_metadata_serves_the_target_lifecycle_state(tmp_path: Path) -> None:
    state = tmp_path / "target-lifecycle-state"
    state.write_text("Warmed:Stopped")
    with MetadataServer() as server:
        url = server.start("127.0.0.1", 0, {"instance_id": "i-1", "address": "127.0.0.1"},
                           target_lifecycle_state=state)
        assert read_metadata(warm_pool.TARGET_LIFECYCLE_STATE_PATH, url) == "Warmed:Stopped"
        state.write_text("InService")  # Auto Scaling moved it: EC2 serves the new target
        assert read_metadata(warm_pool.TARGET_LIFECYCLE_STATE_PATH, url) == "InService"
    with MetadataServer() as server:  # not an Auto Scaling instance: no such item
        url = server.start("127.0.0.1", 0, {"instance_id": "i-2", "address": "127.0.0.1"})
        assert read_metadata(warm_pool.TARGET_LIFECYCLE_STATE_PATH, url) is None


def test_a_warm_pool_worker_registers_only_once_in_service(tmp_path: Path, monkeypatch) -> None:
    """The whole agent: held while Warmed:Stopped (no registration on EFS however long), the
    hook completed once; the state turns InService and it registers."""
    state = tmp_path / "target-lifecycle-state"
    state.write_text("Warmed:Stopped")
    completed: list[str] = []
    monkeypatch.setattr(warm_ready.ReadySignal, "__init__", lambda self, **kw: None)
    monkeypatch.setattr(warm_ready.ReadySignal, "send",
                        lambda self: completed.append(state.read_text()) or "sent")
    efs = tmp_path / "efs"
    efs.mkdir()
    with MetadataServer() as server:
        url = server.start("127.0.0.1", 0, {"instance_id": "i-w", "address": "127.0.0.1"},
                           target_lifecycle_state=state)
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", url)
        config = AgentConfig(role="worker", cluster_id="c1", stack_name="s",
                             region="us-east-1", mount_point=str(efs), no_mount=True,
                             root=str(tmp_path / "root"), launch_hook="warm-launch",
                             warm_ready_queue_url="https://sqs.example/q",
                             warm_poll_interval=0.05, heartbeat_interval=0.05)
        agent = NodeAgent(config, identity=NodeIdentity("i-w", "g5.xlarge", "127.0.0.1",
                                                         "us-east-1"))
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        try:
            registration = ClusterPaths(str(efs)).efs / "cluster" / "nodes" / "i-w.json"
            wait_until(lambda: completed, 5, what="the launch hook completed for the warm pool")
            time.sleep(0.4)  # several polls while held
            assert not registration.exists() and not list(efs.rglob("i-w.json"))
            assert completed == ["Warmed:Stopped"]
            state.write_text("InService")
            wait_until(lambda: list(efs.rglob("i-w.json")), 5, what="the worker registration")
            assert completed == ["Warmed:Stopped", "InService"]
        finally:
            agent.stop.set()
            thread.join(timeout=10)
        assert not thread.is_alive()

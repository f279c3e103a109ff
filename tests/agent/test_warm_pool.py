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

from bootstrap_scripts.agent import warm_pool
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


def _stubbed_hook(error: str | None = None) -> tuple[warm_pool.LaunchHook, Stubber]:
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
    return warm_pool.LaunchHook(hook_name="warm-launch", cluster_id="c1", role="worker",
                                region="us-east-1", instance_id="i-1", client=client), stub


def test_the_hook_is_completed_on_the_clusters_worker_group_for_this_instance() -> None:
    hook, stub = _stubbed_hook()
    assert hook.complete() == "completed"
    stub.assert_no_pending_responses()


def test_no_waiting_action_is_not_an_error() -> None:
    hook, _ = _stubbed_hook("No active Lifecycle Action found with instance ID i-1")
    assert hook.complete() == "none-waiting"


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
    monkeypatch.setattr(warm_pool.LaunchHook, "__init__", lambda self, **kw: None)
    monkeypatch.setattr(warm_pool.LaunchHook, "complete",
                        lambda self: completed.append(state.read_text()) or "completed")
    efs = tmp_path / "efs"
    efs.mkdir()
    with MetadataServer() as server:
        url = server.start("127.0.0.1", 0, {"instance_id": "i-w", "address": "127.0.0.1"},
                           target_lifecycle_state=state)
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", url)
        config = AgentConfig(role="worker", cluster_id="c1", stack_name="s",
                             region="us-east-1", mount_point=str(efs), no_mount=True,
                             root=str(tmp_path / "root"), launch_hook="warm-launch",
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

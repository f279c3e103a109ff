"""The wait-condition FAILURE reason at the setup deadline names what was still missing
(bootstrap_scripts/agent/setup_report.py): pure wording, tested without AWS."""

from __future__ import annotations

from bootstrap_scripts.agent.setup_report import LISTED, GroupSeen, timeout_reason
from bootstrap_scripts.protocol.node_signature import NO_KEY_HINT
from bootstrap_scripts.protocol.records import LaunchAttempt


def reason(groups: dict, registered=(), failures=()) -> str:
    return timeout_reason(cluster_id="c1", timeout=3300, missing=list(groups), groups=groups,
                          registered=set(registered), failures=list(failures))


def test_a_group_that_was_never_created_or_could_not_be_read() -> None:
    text = reason({"master": GroupSeen("master", False),
                   "worker": GroupSeen("worker", False, error="AccessDenied")})
    assert text.startswith("cluster c1: no asg-setup success for master and worker group(s) "
                           "within 3300s; ")
    assert "master group: not found (no Auto Scaling group tagged for the cluster)" in text
    assert "worker group: could not be described (AccessDenied)" in text


def test_unregistered_instances_with_their_type_and_the_last_launch_failure() -> None:
    group = GroupSeen("worker", True, "asg-w", 3, (("i-1", "p5.48xlarge"), ("i-2", "")))
    failures = [LaunchAttempt(role="worker", asg="asg-w", zone="us-east-1a",
                              instance_types=("p5.48xlarge",), cause="old cause"),
                LaunchAttempt(role="master", asg="asg-m", zone="us-east-1b", cause="master's"),
                LaunchAttempt(role="worker", asg="asg-w", zone="us-east-1b",
                              instance_types=("p5.48xlarge",),
                              cause="InsufficientInstanceCapacity")]
    text = reason({"worker": group}, registered={"i-1"}, failures=failures)
    assert ("worker group asg-w: 2 of 3 instances running, 1 registered; not registered "
            "(still booting or failed to boot): i-2 (type unknown); last launch failure: zone "
            "us-east-1b, p5.48xlarge: InsufficientInstanceCapacity") in text
    assert "old cause" not in text and "master's" not in text


def test_an_instance_registered_without_a_node_key_is_named_as_booted() -> None:
    """Its registration is on EFS but the master learnt no key from it (older user data):
    it booted, so it is named with what to do, apart from the ones still booting."""
    group = GroupSeen("worker", True, "asg-w", 3,
                      (("i-1", "g5.xlarge"), ("i-2", "g5.xlarge"), ("i-3", "")))
    text = timeout_reason(cluster_id="c1", timeout=3300, missing=["worker"],
                          groups={"worker": group}, registered={"i-1"}, failures=[],
                          no_key={"i-2"})
    assert ("worker group asg-w: 3 of 3 instances running, 1 registered; booted, but no node "
            f"key learnt from it ({NO_KEY_HINT}): i-2 (g5.xlarge); not registered (still "
            "booting or failed to boot): i-3 (type unknown)") in text


def test_long_lists_are_cut_with_a_count() -> None:
    instances = tuple((f"i-{n:02d}", "g5.xlarge") for n in range(LISTED + 5))
    text = reason({"worker": GroupSeen("worker", True, "asg-w", len(instances), instances)})
    assert f"i-{LISTED - 1:02d} (g5.xlarge) and 5 more" in text
    assert f"i-{LISTED:02d}" not in text

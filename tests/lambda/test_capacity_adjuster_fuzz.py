"""Hostile and malformed events: nothing escapes the handler, no capacity changes wrongly.

The cloud holds three groups that no event may legitimately change:
- ours, at its desired capacity (a launch error there finds nothing to lower);
- another cluster's group, one launch short (a launch error there would lower it if the
  adjuster trusted names or ignored the cluster tag);
- an untagged group whose NAME contains our cluster id, one launch short.
Every generated event is run through the handler and the three groups are checked after
each one; the queue must only ever receive well-formed messages about our group.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
from adjuster_harness import (
    ALL_FIXTURES,
    FIXTURE_BY_EVENT,
    Cloud,
    drop_instances,
    fixture_record,
    import_adjuster,
    lambda_environment,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws

adjuster = import_adjuster()

OURS = "DLClusterStack-WorkerGroupASG-FULL"
FOREIGN = "OtherStack-WorkerGroupASG-SHORT"
LOOKALIKE = "DLClusterStack-WorkerGroupASG-UNTAGGED"
EXPECTED_DESIRED = {OURS: 3, FOREIGN: 4, LOOKALIKE: 4}
EXAMPLES = 60  # per test below; three tests → 180 hostile events


@pytest.fixture(scope="module")
def fuzz_cloud() -> Iterator[tuple[Cloud, str]]:
    mp = pytest.MonkeyPatch()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
    }.items():
        mp.setenv(key, value)
    mp.delenv("AWS_ENDPOINT_URL", raising=False)
    try:
        with mock_aws():
            c = Cloud()
            queue_url = c.queue()
            lambda_environment(mp, queue_url, LOG_LEVEL="ERROR")
            c.group(OURS, min_size=0, desired=3, max_size=4)
            c.group(FOREIGN, min_size=0, desired=4, max_size=4, cluster_id="OtherStack")
            drop_instances(FOREIGN, 1)
            c.group(LOOKALIKE, min_size=0, desired=4, max_size=4, cluster_id=None)
            drop_instances(LOOKALIKE, 1)
            yield c, queue_url
    finally:
        mp.undo()


def _check(c: Cloud, queue_url: str, event: Any) -> None:
    """Run one event; assert nothing escaped and nothing changed wrongly."""
    result = adjuster.handler(event, None)
    assert isinstance(result, dict)
    for outcome in result["outcomes"] or ["no-records"]:
        hypothesis.event(outcome)  # --hypothesis-show-statistics shows what was reached
    for name, desired in EXPECTED_DESIRED.items():
        assert c.desired(name) == desired, (name, event)
    for message in c.messages(queue_url):
        assert message["asg"] == OURS, message
        assert message["cluster_id"] == "DLClusterStack"
        assert message["event"] in ("asg-setup", "membership-change", "drain-request")
        if message["event"] == "drain-request":
            assert re.fullmatch(r"i-[0-9a-f]{8,17}", message["instance_id"]), message
            assert message["lifecycle_action_token"] and message["lifecycle_hook"], message
        if message["event"] == "asg-setup":
            assert (message["status"], message["desired"], message["launched"]) == (
                "success", 3, 3,
            )  # fmt: skip


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
hostile_text = st.one_of(
    st.text(),
    st.sampled_from(
        [
            "",
            " ",
            "*",
            "../../etc/passwd",
            "DLClusterStack",
            OURS + "\n",
            OURS + "\x00",
            "x" * 256,
            "x" * 5000,
            "i-",
            "i-XYZ",
            "'; DROP TABLE groups; --",
            "\ud800",
        ]
    ),
)
group_names = st.one_of(st.sampled_from([OURS, FOREIGN, LOOKALIKE, "no-such-group"]), hostile_text)
event_names = st.one_of(
    st.sampled_from(sorted(FIXTURE_BY_EVENT)),
    st.sampled_from(["autoscaling:EC2_INSTANCE_LAUNCHING", "AUTOSCALING:EC2_INSTANCE_LAUNCH"]),
    hostile_text,
)
field_values = st.one_of(hostile_text, json_values)


@st.composite
def hostile_messages(draw: st.DrawFn) -> dict[str, Any]:
    """A real fixture's message with fields replaced, removed or retyped."""
    event = draw(st.sampled_from(sorted(ALL_FIXTURES)))
    message = json.loads(fixture_record(event, OURS)["Sns"]["Message"])
    # mostly real group names and events, so the interesting paths (another cluster's
    # short group, a look-alike name) are reached often, not by luck
    if draw(st.integers(0, 9)) < 8:
        message["AutoScalingGroupName"] = draw(st.sampled_from([OURS, FOREIGN, LOOKALIKE]))
    else:
        message["AutoScalingGroupName"] = draw(group_names)
    if "LifecycleTransition" in message:
        if draw(st.integers(0, 9)) < 2:
            message["LifecycleTransition"] = draw(event_names)
    elif draw(st.integers(0, 9)) < 2:
        message["Event"] = draw(event_names)
    for key in draw(st.lists(st.sampled_from(sorted(message)), max_size=3, unique=True)):
        if draw(st.booleans()):
            del message[key]
        else:
            message[key] = draw(field_values)
    return message


def _record_with(message_text: Any) -> dict[str, Any]:
    record = fixture_record("autoscaling:EC2_INSTANCE_LAUNCH_ERROR", OURS)
    record["Sns"]["Message"] = message_text
    return record


_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_settings
@given(event=st.one_of(json_values, st.dictionaries(st.just("Records"), json_values)))
def test_arbitrary_json_events(fuzz_cloud: tuple[Cloud, str], event: Any) -> None:
    _check(*fuzz_cloud, event)


@_settings
@given(
    message_text=st.one_of(
        st.text(),
        json_values.map(json.dumps),
        st.just("[" * 5000 + "]" * 5000),  # deep nesting
        json_values,  # not even a string
    )
)
def test_garbage_sns_messages(fuzz_cloud: tuple[Cloud, str], message_text: Any) -> None:
    _check(*fuzz_cloud, {"Records": [_record_with(message_text)]})


@_settings
@given(messages=st.lists(hostile_messages(), min_size=1, max_size=3))
def test_hostile_notifications(fuzz_cloud: tuple[Cloud, str], messages: list[dict]) -> None:
    records = [_record_with(json.dumps(message)) for message in messages]
    _check(*fuzz_cloud, {"Records": records})

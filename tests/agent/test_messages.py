"""Parsing the Lambda's messages: typed when well-formed, a named reason when not."""

from __future__ import annotations

import json

import pytest

from bootstrap_scripts.protocol.messages import (
    AsgSetup,
    BadMessage,
    MembershipChange,
    parse_message,
)

SETUP = {"event": "asg-setup", "status": "success", "asg": "g-w", "role": "worker",
         "cluster_id": "c", "min": 0, "desired": 3, "max": 4, "launched": 3,
         "instances": ["i-1", "i-2", "i-3"], "reason": "3 of 3", "cause": "",
         "dedupe_key": "ab", "sent_at": "2026-11-21T20:00:00Z"}
CHANGE = {"event": "membership-change", "change": "launch", "asg": "g-w", "role": "worker",
          "cluster_id": "c", "instance_id": "i-9", "desired": 3, "launched": 3,
          "dedupe_key": "cd", "sent_at": "2026-11-21T20:00:00Z"}


def test_asg_setup_is_parsed():
    msg = parse_message(json.dumps(SETUP))
    assert isinstance(msg, AsgSetup)
    assert (msg.role, msg.status, msg.desired, msg.instances) == (
        "worker", "success", 3, ("i-1", "i-2", "i-3"))


def test_membership_change_is_parsed():
    msg = parse_message(json.dumps(CHANGE))
    assert isinstance(msg, MembershipChange)
    assert (msg.change, msg.instance_id) == ("launch", "i-9")


def test_sns_envelope_is_unwrapped():
    msg = parse_message(json.dumps({"Type": "Notification", "Message": json.dumps(SETUP)}))
    assert isinstance(msg, AsgSetup)


@pytest.mark.parametrize(("body", "why"), [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"event": "worker-setup", "master-ip": "10.0.0.1"}), "unknown event"),
    (json.dumps({**SETUP, "role": "boss"}), "unknown role 'boss'"),
    (json.dumps({**SETUP, "status": "meh"}), "unknown asg-setup status 'meh'"),
    (json.dumps({k: v for k, v in SETUP.items() if k != "asg"}), "lacks field 'asg'"),
    (json.dumps({**SETUP, "desired": "three"}), "field 'desired'"),
    (json.dumps({**SETUP, "instances": "i-1"}), "'instances' must be a list"),
    (json.dumps({k: v for k, v in CHANGE.items() if k != "change"}), "lacks field 'change'"),
])
def test_malformed_messages_are_reported_not_raised(body, why):
    msg = parse_message(body)
    assert isinstance(msg, BadMessage)
    assert why in msg.reason


@pytest.mark.parametrize(("field", "text", "shown"), [
    ("desired", "1e400", "inf"),
    ("desired", "-1e400", "-inf"),
    ("desired", "NaN", "nan"),
    ("desired", "Infinity", "inf"),
    ("desired", "-1", "-1"),
    ("desired", "true", "True"),
    ("desired", "3.0", "3.0"),
    ("desired", "10001", "10001"),
    ("launched", "1" + "0" * 40, "1" + "0" * 39),
    ("min", "[3]", "[3]"),
    ("max", "{}", "{}"),
])
def test_hostile_numbers_are_refused_naming_the_field_and_value(field, text, shown):
    """An SQS body is text: JSON gives 1e400 as inf, NaN as nan, true as an int; none may
    reach the agent (``int(inf)`` was an OverflowError that crash-looped the master)."""
    body = json.dumps({**SETUP, field: "X"}).replace('"X"', text)
    msg = parse_message(body)
    assert isinstance(msg, BadMessage), msg
    assert f"field {field!r}" in msg.reason and shown in msg.reason


@pytest.mark.parametrize("body", [
    json.dumps({**CHANGE, "desired": "X"}).replace('"X"', "1e400"),
    json.dumps({**CHANGE, "launched": "X"}).replace('"X"', "-5"),
    json.dumps({**SETUP, "desired": "X"}).replace('"X"', "9" * 5000),  # past int's digit limit
    json.dumps({**SETUP, "attempts": [{"zone": 1}]}),
    json.dumps({**SETUP, "attempts": [{"instance_types": [1e308]}]}),
    json.dumps({**SETUP, "instances": [1, 2]}),
    json.dumps({**SETUP, "reason": {"nested": True}}),
    json.dumps({**SETUP, "asg": 7}),
    json.dumps({"Message": json.dumps({**SETUP, "max": -1})}),
    b"\xff\xfe",
    None,
])
def test_no_body_makes_the_parser_raise(body):
    assert isinstance(parse_message(body), BadMessage)


def test_documented_ranges_are_accepted():
    msg = parse_message(json.dumps({**SETUP, "desired": 10000, "launched": 0, "min": 0,
                                    "max": 10000}))
    assert isinstance(msg, AsgSetup) and msg.desired == 10000

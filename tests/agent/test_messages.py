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
    (json.dumps({**SETUP, "desired": "three"}), "bad value"),
    (json.dumps({**SETUP, "instances": "i-1"}), "'instances' must be a list"),
    (json.dumps({k: v for k, v in CHANGE.items() if k != "change"}), "lacks field 'change'"),
])
def test_malformed_messages_are_reported_not_raised(body, why):
    msg = parse_message(body)
    assert isinstance(msg, BadMessage)
    assert why in msg.reason

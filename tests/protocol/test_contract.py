"""docs/protocol.md and the code say the same thing; the Lambda speaks the agent's language.

The Lambda's asset ships only ``lambda_src/``, so its message builders cannot import the
protocol package; instead this test holds every builder to the dataclasses the master agent
parses with, field by field.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from bootstrap_scripts.protocol import jobs, managed_records, messages, records
from bootstrap_scripts.protocol.paths import LAYOUT
from lambda_src import master_messages

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
RECORDS = [obj for module in (records, managed_records, jobs) for obj in vars(module).values()
           if isinstance(obj, type) and issubclass(obj, records.Record)
           and obj is not records.Record and obj.__module__ == module.__name__]


@pytest.mark.parametrize("path", LAYOUT)
def test_every_path_is_documented(path: str) -> None:
    assert path in DOC, f"docs/protocol.md does not mention {path}"


def test_every_documented_efs_path_exists_in_code() -> None:
    listed = re.findall(r"^((?:cluster|jobs|checkpoints|opt|etc|var)/\S+)", DOC, flags=re.M)
    assert listed, "the file lists in docs/protocol.md were not found"
    for path in listed:
        assert path in LAYOUT, f"docs/protocol.md lists {path}, which protocol.paths lacks"


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_record_and_field_is_documented(cls: type) -> None:
    row = re.search(rf"^\| `{cls.__name__}` \|(.*)\|$", DOC, flags=re.M)
    assert row, f"docs/protocol.md has no row for {cls.__name__}"
    documented = set(re.findall(r"`(\w+)`", row.group(1)))
    fields = {f.name for f in dataclasses.fields(cls)}
    assert documented == fields, (
        f"{cls.__name__}: documented {sorted(documented)} != code {sorted(fields)}")


def _built() -> dict[type, dict]:
    return {
        messages.AsgSetup: master_messages.asg_setup(
            status="failure", asg="g", role="worker", cluster_id="c", min_size=1, desired=3,
            max_size=4, instances=["i-2", "i-1"], reason="r", cause="c"),
        messages.MembershipChange: master_messages.membership_change(
            change="terminate", asg="g", role="worker", cluster_id="c", instance_id="i-1",
            desired=2, instances=["i-2"]),
        messages.DrainRequest: master_messages.drain_request(
            asg="g", role="worker", cluster_id="c", instance_id="i-1", lifecycle_hook="drain",
            lifecycle_action_token="tok"),
    }


@pytest.mark.parametrize("cls", messages.MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_lambda_builders_match_the_agents_messages(cls: type) -> None:
    body = _built()[cls]
    assert body["event"] == cls.EVENT
    assert set(body) == messages.body_fields(cls), "the Lambda and the agent disagree on fields"
    parsed = messages.parse_message(json.dumps(body))
    assert isinstance(parsed, cls)
    for f in dataclasses.fields(cls):
        value = getattr(parsed, f.name)
        expected = body[f.name]
        assert value == (tuple(expected) if isinstance(value, tuple) else expected), f.name


@pytest.mark.parametrize("cls", messages.MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_every_message_and_field_is_documented(cls: type) -> None:
    assert f'"event": "{cls.EVENT}"' in DOC or f"`{cls.EVENT}`" in DOC
    for name in messages.body_fields(cls):
        assert f'"{name}"' in DOC, f"docs/protocol.md never shows the {name!r} field"

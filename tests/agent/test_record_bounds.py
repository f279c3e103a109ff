"""Numbers in the records the agent reads are checked against their documented ranges."""

from __future__ import annotations

import json
import logging

import pytest

from bootstrap_scripts.agent.master_state import GroupSetup, MasterState, load_state
from bootstrap_scripts.protocol import bounds, state
from bootstrap_scripts.protocol.membership import Membership, MembershipError, build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import DrainRecord, Registration

GOOD = build_membership(cluster_id="c", generation=3,
                        master={"instance_id": "i-m", "address": "10.0.0.1"},
                        workers=[{"instance_id": "i-w", "address": "10.0.0.2", "gpus": 8}])


def _with(doc: dict, path: tuple, raw: str) -> str:
    """``doc`` as JSON with the value at ``path`` replaced by the raw JSON text ``raw``."""
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = "@@X@@"
    return json.dumps(doc).replace('"@@X@@"', raw)


@pytest.mark.parametrize(("path", "raw", "field"), [
    (("generation",), "1e400", "generation"),
    (("generation",), "NaN", "generation"),
    (("generation",), "-1", "generation"),
    (("generation",), "true", "generation"),
    (("generation",), "2.0", "generation"),
    (("generation",), "1" + "0" * 30, "generation"),
    (("nodes", 1, "gpus"), "1e400", "nodes[1].gpus"),
    (("nodes", 1, "gpus"), "-1", "nodes[1].gpus"),
    (("nodes", 1, "gpus"), "65", "nodes[1].gpus"),
    (("nodes", 1, "rank"), "true", "nodes[1].rank"),
    (("nodes", 1, "base"), '"no"', "nodes[1].base"),
])
def test_a_membership_with_a_hostile_number_is_refused_naming_it(path, raw, field):
    text = _with(GOOD.to_dict(), path, raw)
    with pytest.raises(MembershipError) as exc:
        Membership.from_json(text)  # an OverflowError (not a MembershipError) before
    assert field in str(exc.value)


def test_a_good_membership_still_reads():
    assert Membership.from_json(GOOD.to_json()) == GOOD


@pytest.mark.parametrize(("field", "raw"), [
    ("heartbeat", "1e400"), ("heartbeat", "NaN"), ("started_at", "-1"),
    ("agent_pid", "99999999"), ("generation_applied", "-2"), ("gpus", "100"),
])
def test_a_registration_out_of_range_is_refused_and_logged(tmp_path, caplog, field, raw):
    reg = Registration(instance_id="i-w", address="10.0.0.2", role="worker")
    path = ClusterPaths(tmp_path).registration("i-w")
    path.parent.mkdir(parents=True)
    path.write_text(_with(reg.to_dict(), (field,), raw))
    with caplog.at_level(logging.WARNING, logger="dl-agent.records"):
        assert state.read_registration(tmp_path, "i-w") is None
        assert state.read_registrations(tmp_path) == {}
    assert f"field {field!r}" in caplog.text and "event=refused-record" in caplog.text


def test_a_drain_record_out_of_range_is_refused(tmp_path):
    rec = DrainRecord(instance_id="i-w", address="10.0.0.2", requested_at=1.0, deadline=2.0,
                      asg="g", role="worker", lifecycle_hook="drain", lifecycle_action_token="t")
    state.write_drain(tmp_path, rec)
    assert state.read_drain(tmp_path, "i-w") == rec
    path = ClusterPaths(tmp_path).drain_request("i-w")
    path.write_text(_with(rec.to_dict(), ("deadline",), "1e400"))
    assert state.read_drain(tmp_path, "i-w") is None
    assert state.pending_drains(tmp_path) == {}


@pytest.mark.parametrize("cls", [Registration, DrainRecord])
def test_every_numeric_field_has_a_range(cls):
    assert bounds.numeric_fields(cls) == set(state.RECORD_RANGES[cls])


def test_the_masters_state_out_of_range_is_not_loaded(tmp_path):
    path = tmp_path / "state.json"
    good = MasterState(setup_started=100.0, setup={"worker": GroupSetup(
        status="success", asg="g", role="worker", desired=2, launched=2)})
    path.write_text(good.to_json())
    assert load_state(path) == good
    path.write_text(_with(good.to_dict(), ("setup_started",), "1e400"))
    assert load_state(path) is None
    path.write_text(_with(good.to_dict(), ("setup", "worker", "desired"), "-4"))
    assert load_state(path) is None

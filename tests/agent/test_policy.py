"""The master's membership decisions, without AWS, files or clocks (agent/policy.py)."""

from __future__ import annotations

import pytest

from bootstrap_scripts.agent import policy
from bootstrap_scripts.agent.aws import classify_completion_error
from bootstrap_scripts.agent.discovery import Instance
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.records import Registration

MASTER = {"instance_id": "i-m", "address": "10.0.0.5", "gpus": 8}


def inst(n: int, *, spot: bool = False) -> Instance:
    return Instance(f"i-{n}", f"10.0.128.{n}", "p3.2xlarge", spot=spot)


def members(*nodes: tuple[int, bool]) -> dict:
    m = build_membership(cluster_id="c", generation=1, master=MASTER,
                         workers=[{"instance_id": f"i-{n}", "address": f"10.0.128.{n}",
                                   "base": base} for n, base in nodes])
    return {n.instance_id: n for n in m.nodes}


# -- joining -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("facts", "blocker"), [
    ({"drained": True, "registered": True, "data_prep": False, "prep": None}, policy.DRAINED),
    ({"drained": False, "registered": False, "data_prep": True, "prep": "ok"},
     policy.UNREGISTERED),
    ({"drained": False, "registered": True, "data_prep": True, "prep": None}, policy.PREPARING),
    ({"drained": False, "registered": True, "data_prep": True, "prep": "failed"},
     policy.PREP_FAILED),
    ({"drained": False, "registered": True, "data_prep": True, "prep": "ok"}, None),
    ({"drained": False, "registered": True, "data_prep": False, "prep": None}, None),
])
def test_join_blocker(facts, blocker):
    assert policy.join_blocker(**facts) == blocker


def test_split_workers_keeps_members_admits_unblocked_and_drops_permanent():
    workers = [inst(1), inst(2), inst(3), inst(4), inst(5)]
    eligible, pending = policy.split_workers(
        workers, members={"i-1", "i-2"}, draining={"i-2"},
        blockers={"i-3": None, "i-4": policy.PREPARING, "i-5": policy.PREP_FAILED})
    assert [w.instance_id for w in eligible] == ["i-1", "i-3"]
    assert pending == {"i-4"}


def test_forming_workers_without_and_with_data_prep():
    workers = [inst(1), inst(2), inst(3)]
    ready, left = policy.forming_workers(workers, draining={"i-3"}, prepared=None)
    assert [w.instance_id for w in ready] == ["i-1", "i-2"] and left == []
    ready, left = policy.forming_workers(workers, draining={"i-3"}, prepared={"i-2"})
    assert [w.instance_id for w in ready] == ["i-2"] and left == ["i-1"]


# -- base workers ------------------------------------------------------------------------------
def test_choose_base_takes_on_demand_first_in_address_order():
    workers = [inst(10), inst(9, spot=True), inst(2), inst(3)]
    assert policy.base_target(-1, len(workers)) == 4
    assert policy.choose_base(workers, 2) == {"i-2", "i-3"}
    assert policy.choose_base(workers, 3) == {"i-2", "i-3", "i-10"}
    assert policy.choose_base(workers, 4) == {"i-2", "i-3", "i-10", "i-9"}


def test_base_after_keeps_flags_and_promotes_on_demand_group_members():
    current = members((1, True), (2, False))
    eligible = [inst(1), inst(2), inst(7, spot=True), inst(5), inst(6)]
    assert policy.restored_target(-1, current) == 1
    # a base worker left (target 2, one remains): the lowest on-demand group joiner is promoted
    base = policy.base_after(eligible, current, target=2, group_members={"i-5", "i-6", "i-7"})
    assert base == {"i-1", "i-5"}
    # hand-started nodes (not in the group) are never promoted
    assert policy.base_after(eligible, current, target=2, group_members={"i-7"}) == {"i-1"}


def test_newly_base_and_protection_targets():
    before = members((1, True), (2, False))
    after = build_membership(cluster_id="c", generation=2, master=MASTER, workers=[
        {"instance_id": "i-1", "address": "10.0.128.1", "base": True},
        {"instance_id": "i-3", "address": "10.0.128.3", "base": True}])
    assert policy.newly_base(after, before) == {"i-3"}
    assert policy.protection_targets(after) == {"master": ["i-m"], "worker": ["i-1", "i-3"]}


# -- entries and GPU counts --------------------------------------------------------------------
def test_worker_entries_take_gpus_from_registrations_and_report_guesses():
    regs = {"i-1": Registration(instance_id="i-1", address="10.0.128.1", role="worker", gpus=4)}
    entries, guessed = policy.worker_entries([inst(1), inst(2)], regs, base={"i-1"},
                                             fallback_gpus=8)
    assert [(e["instance_id"], e["gpus"], e["base"]) for e in entries] == [
        ("i-1", 4, True), ("i-2", 8, False)]
    assert guessed == {"i-2"}
    entries, _ = policy.worker_entries([inst(1)], regs, base=None, fallback_gpus=0)
    assert entries[0]["base"] is True


def test_gpu_corrections():
    current = build_membership(cluster_id="c", generation=1, master=MASTER, workers=[
        {"instance_id": "i-1", "address": "10.0.128.1", "gpus": 8}])
    same = {"i-1": Registration(instance_id="i-1", address="10.0.128.1", role="worker", gpus=8)}
    other = {"i-1": Registration(instance_id="i-1", address="10.0.128.1", role="worker", gpus=2)}
    assert policy.gpu_corrections(current, same) == (False, {"i-1"})
    assert policy.gpu_corrections(current, other) == (True, {"i-1"})
    assert policy.gpu_corrections(current, {}) == (False, set())


# -- drains ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("facts", "plan"), [
    ({"is_master": True, "is_member": True, "formed": True}, policy.DrainPlan("master", False)),
    ({"is_master": False, "is_member": False, "formed": True},
     policy.DrainPlan("not-a-member", True)),
    ({"is_master": False, "is_member": True, "formed": False},
     policy.DrainPlan("not-a-member", False)),
    ({"is_master": False, "is_member": True, "formed": True}, policy.DrainPlan(None, True)),
])
def test_plan_drain(facts, plan):
    assert policy.plan_drain(**facts) == plan


def test_drain_due():
    assert policy.drain_due(now=10, deadline=20, retry_at=0, done=False) is None
    assert policy.drain_due(now=10, deadline=20, retry_at=0, done=True) == "done"
    assert policy.drain_due(now=20, deadline=20, retry_at=0, done=False) == "deadline"
    assert policy.drain_due(now=20, deadline=20, retry_at=21, done=True) is None
    assert [policy.retry_delay(a) for a in (1, 2, 4)] == [2.0, 4.0, 8.0]


class _ClientError(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}}


class ParamValidationError(Exception):
    """Named as botocore's: a request that can never succeed."""


def test_completion_errors_are_classified():
    gone = classify_completion_error(_ClientError("ValidationError"))
    assert gone.final and gone.outcome.startswith("no-active-action: ")
    throttled = classify_completion_error(_ClientError("Throttling"))
    assert not throttled.final
    invalid = classify_completion_error(ParamValidationError("bad token"))
    assert invalid.final and invalid.outcome.startswith("invalid-request")


# -- setup and polling -------------------------------------------------------------------------
def test_setup_complete_and_missing_groups():
    assert not policy.setup_complete({"master": "success"})
    assert policy.missing_groups({"master": "success"}) == ["worker"]
    assert not policy.setup_complete({"master": "success", "worker": "failure"})
    assert policy.setup_complete({"master": "success", "worker": "success"})


def test_receive_wait():
    kw = {"poll_wait": 20, "join_poll": 5}
    assert policy.receive_wait(formed=False, seconds_left=100, look_often=False, drains=False,
                               **kw) == 20
    assert policy.receive_wait(formed=False, seconds_left=2.5, look_often=False, drains=False,
                               **kw) == 3
    assert policy.receive_wait(formed=False, seconds_left=-4, look_often=False, drains=False,
                               **kw) == 0
    assert policy.receive_wait(formed=True, seconds_left=0, look_often=False, drains=False,
                               **kw) == 5
    assert policy.receive_wait(formed=True, seconds_left=0, look_often=True, drains=False,
                               **kw) == 1
    assert policy.receive_wait(formed=False, seconds_left=100, look_often=False, drains=True,
                               **kw) == 1


# -- starting: resume, take over or form -------------------------------------------------------
@pytest.mark.parametrize(("recorded_cluster", "recorded_master", "master_group", "expected"), [
    (None, "", set(), policy.NEW_CLUSTER),  # nothing on EFS: a new cluster
    ("other", "i-old", set(), policy.NEW_CLUSTER),  # another cluster's membership
    ("dlc", "i-me", {"i-me"}, policy.RESUME),  # our own cluster: the agent restarted
    ("dlc", "i-me", set(), policy.RESUME),
    ("dlc", "i-old", {"i-me"}, policy.TAKE_OVER),  # the old master left the group
    ("dlc", "i-old", set(), policy.TAKE_OVER),
    ("dlc", "i-old", {"i-old", "i-me"}, policy.NOT_OURS_TO_TAKE),  # it still runs
])
def test_start_decision(recorded_cluster, recorded_master, master_group, expected):
    assert policy.start_decision(cluster_id="dlc", me="i-me", recorded_cluster=recorded_cluster,
                                 recorded_master=recorded_master,
                                 master_group=master_group) == expected


@pytest.mark.parametrize(("failed_min", "live_now", "holds"), [
    (1, 0, True),      # still below its minimum: the failure stands
    (1, 1, False),     # reached its minimum since: outdated
    (2, 3, False),
    (1, None, True),   # the group cannot be read: trust the message
    (0, 0, False),     # a minimum of 0 is always reached
])
def test_setup_failure_holds(failed_min, live_now, holds):
    assert policy.setup_failure_holds(failed_min=failed_min, live_now=live_now) is holds

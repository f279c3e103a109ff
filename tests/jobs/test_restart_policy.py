"""The restart policy as tables: what a managed job does after each kind of ending."""

from __future__ import annotations

import signal

import pytest

from bootstrap_scripts.jobs.engine.classify import Failure, FailureClass, FailureKind, classify
from bootstrap_scripts.jobs.engine.restart_policy import (
    Action,
    JobState,
    Policy,
    World,
    check_transition,
    choose_world,
    decide,
    join_restarts_workers,
)
from bootstrap_scripts.protocol.jobs import EXECUTOR_RESTARTED_REASON
from bootstrap_scripts.protocol.nnodes import node_range, parse_nnodes, requested_minimum
from bootstrap_scripts.protocol.records import (
    FAULT_INFRASTRUCTURE,
    JobResult,
    NodeResult,
    ShareExit,
)

CODE = Failure(FailureKind.CODE, "node rank 1 exited with code 1")
LOST = Failure(FailureKind.NODE_LOST, "heartbeat stopped", "10.0.1.5")
KILLED = Failure(FailureKind.SIGNALLED, "killed by SIGKILL", "10.0.1.5")
UNHEALTHY = Failure(FailureKind.NODE_UNHEALTHY, "gpus: 4 (expected 8)", "10.0.1.5")
MASTER = Failure(FailureKind.MASTER_LOST, "controller gone")
CANCELLED = Failure(FailureKind.CANCELLED, "cancelled")
INFRA = Failure(FailureKind.EXECUTOR_RESTARTED, "the job executor restarted", "10.0.1.5")


@pytest.mark.parametrize(("failure", "restarts", "code_restarts", "policy", "cancel",
                          "action", "state"), [
    (None, 0, 0, Policy(), False, Action.SUCCEED, JobState.SUCCEEDED),
    (None, 2, 0, Policy(), True, Action.CANCEL, JobState.CANCELLED),
    (CANCELLED, 0, 0, Policy(), False, Action.CANCEL, JobState.CANCELLED),
    (LOST, 0, 0, Policy(), False, Action.RESTART, JobState.RESTARTING),
    # a share killed by SIGKILL is the job's own failure (its user can send it): not retried
    (KILLED, 0, 0, Policy(), False, Action.FAIL, JobState.FAILED),
    (KILLED, 0, 0, Policy(max_code_restarts=1), False, Action.RESTART, JobState.RESTARTING),
    (UNHEALTHY, 1, 0, Policy(), False, Action.RESTART, JobState.RESTARTING),
    (MASTER, 0, 0, Policy(), False, Action.RESTART, JobState.RESTARTING),
    (LOST, 3, 0, Policy(), False, Action.FAIL, JobState.FAILED),  # default 3 used up
    (LOST, 0, 0, Policy(max_restarts=0), False, Action.FAIL, JobState.FAILED),
    (CODE, 0, 0, Policy(), False, Action.FAIL, JobState.FAILED),  # code: not retried
    (CODE, 0, 0, Policy(max_code_restarts=1), False, Action.RESTART, JobState.RESTARTING),
    (CODE, 1, 1, Policy(max_code_restarts=1), False, Action.FAIL, JobState.FAILED),
    (CODE, 3, 0, Policy(max_code_restarts=5), False, Action.FAIL, JobState.FAILED),
    (LOST, 1, 1, Policy(max_code_restarts=1), False, Action.RESTART, JobState.RESTARTING),
    (KILLED, 0, 0, Policy(), True, Action.CANCEL, JobState.CANCELLED),
])
def test_decide(failure, restarts, code_restarts, policy, cancel, action, state):
    d = decide(failure, restarts=restarts, code_restarts=code_restarts, policy=policy,
               cancel_requested=cancel)
    assert (d.action, d.state) == (action, state), d.reason


def test_a_code_failure_says_why_it_is_not_retried():
    d = decide(CODE, restarts=0, code_restarts=0, policy=Policy())
    assert "not retried (--max-code-restarts 0)" in d.reason and CODE.detail in d.reason


@pytest.mark.parametrize(("full", "ready", "waited", "policy", "world"), [
    (3, 3, 0, Policy(), World.FULL),
    (3, 4, 0, Policy(), World.FULL),
    (3, 2, 10, Policy(replace_timeout=900), World.WAIT),
    (3, 2, 900, Policy(replace_timeout=900), World.FAIL),  # min-nodes: all
    (3, 2, 900, Policy(replace_timeout=900, min_nodes=2), World.SURVIVORS),
    (3, 1, 5, Policy(replace_timeout=5, min_nodes=2), World.FAIL),
    (3, 0, 5, Policy(replace_timeout=5, min_nodes=1), World.FAIL),  # no master: nothing
    (2, 1, 0, Policy(replace_timeout=0, min_nodes=1), World.SURVIVORS),
])
def test_choose_world(full, ready, waited, policy, world):
    assert choose_world(full_size=full, ready=ready, waited=waited, policy=policy).world is world


ELASTIC = Policy(elastic=True, replace_timeout=900)


@pytest.mark.parametrize(("full", "ready", "waited", "policy", "world"), [
    # elastic, torchrun MIN 1 (its default) or given: the survivors now, no waiting
    (4, 3, 0, ELASTIC, World.SURVIVORS_NOW),
    (4, 1, 0, ELASTIC, World.SURVIVORS_NOW),
    (4, 3, 0, Policy(elastic=True, elastic_min=3), World.SURVIVORS_NOW),
    # below torchrun's MIN or --min-nodes: wait for the replacement, as before
    (4, 2, 10, Policy(elastic=True, elastic_min=3, replace_timeout=900), World.WAIT),
    (4, 2, 10, Policy(elastic=True, min_nodes=3, replace_timeout=900), World.WAIT),
    (4, 2, 900, Policy(elastic=True, min_nodes=3, replace_timeout=900), World.FAIL),
    # --min-nodes below torchrun's MIN: MIN wins (torchrun would not form a rendezvous)
    (4, 2, 900, Policy(elastic=True, min_nodes=1, elastic_min=3, replace_timeout=900),
     World.FAIL),
    (4, 4, 0, ELASTIC, World.FULL),
    (4, 0, 0, ELASTIC, World.WAIT),  # not even the master: nothing to run on
    # not elastic: today's behaviour exactly (wait, then survivors >= --min-nodes)
    (4, 3, 0, Policy(min_nodes=1, replace_timeout=900), World.WAIT),
    (4, 3, 900, Policy(min_nodes=1, replace_timeout=900), World.SURVIVORS),
])
def test_choose_world_elastic_restarts_on_the_survivors_at_once(full, ready, waited, policy,
                                                                world):
    choice = choose_world(full_size=full, ready=ready, waited=waited, policy=policy)
    assert choice.world is world, choice.reason


def test_the_survivors_now_reason_says_the_sizes_and_that_the_replacement_joins():
    choice = choose_world(full_size=4, ready=3, waited=0, policy=ELASTIC)
    assert choice.reason.startswith("restarting on 3 of 4 node(s) now")
    assert "the replacement joins when ready" in choice.reason


@pytest.mark.parametrize(("nnodes", "minimum"), [
    ("", 1), ("1:64", 1), ("3:8", 3), (" 2 : 4", 2), ("x:4", 1), ("0:4", 1), ("5", 5)])
def test_elastic_minimum_is_torchruns_min(nnodes, minimum):
    assert requested_minimum(nnodes) == minimum


@pytest.mark.parametrize(("old", "new", "ok"), [
    (JobState.QUEUED, JobState.RUNNING, True),
    (JobState.QUEUED, JobState.CANCELLED, True),
    (JobState.RUNNING, JobState.RESTARTING, True),
    (JobState.RESTARTING, JobState.RUNNING, True),
    (JobState.RUNNING, JobState.SUCCEEDED, True),
    (JobState.RESTARTING, JobState.SUCCEEDED, False),
    (JobState.SUCCEEDED, JobState.RUNNING, False),
    (JobState.CANCELLED, JobState.QUEUED, False),
    (JobState.RUNNING, JobState.QUEUED, False),
])
def test_transitions(old, new, ok):
    if ok:
        assert check_transition(old, new) is new
    else:
        with pytest.raises(ValueError, match=f"from {old.value} to {new.value}"):
            check_transition(old, new)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_restarts": -1}, "--max-restarts must be >= 0, got -1"),
    ({"min_nodes": -2}, "--min-nodes must be >= 0, got -2"),
    ({"max_code_restarts": -1}, "--max-code-restarts must be >= 0"),
    ({"replace_timeout": -5}, "--replace-timeout must be >= 0 s, got -5"),
    ({"elastic": True, "elastic_min": 0}, "--nnodes MIN must be >= 1, got 0"),
])
def test_policy_rejects_bad_values_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Policy(**kwargs)


def result(status: str, *nodes: NodeResult) -> JobResult:
    return JobResult(job_id="j.1", status=status, launcher="torchrun", nodes=nodes)


def share_exit(rank: int, rc: int, *, at: float, cancelled: bool = False,
               reason: str = "") -> ShareExit:
    return ShareExit(rank=rank, address=f"10.0.1.{rank}", returncode=rc,
                     signal=-rc if rc < 0 else 0, cancelled=cancelled, finished_at=at,
                     reason=reason)


def node(rank: int, rc: int | None, reason: str = "") -> NodeResult:
    return NodeResult(rank=rank, address=f"10.0.1.{rank}", returncode=rc, reason=reason)


@pytest.mark.parametrize(("res", "exits", "runner_code", "kind", "rank"), [
    (result("succeeded", node(0, 0), node(1, 0)), {}, 0, None, None),
    (result("cancelled", node(0, -15)), {}, 143, FailureKind.CANCELLED, None),
    # a lost node is to blame, whatever its peers did
    (result("failed", node(0, 1), node(1, None, "executor heartbeat stopped 11 s ago")),
     {0: share_exit(0, 1, at=5)}, 1, FailureKind.NODE_LOST, 1),
    # SIGKILL of a share (not the job's cancel) is the likely cause, even if a peer failed
    # first by consequence; it is the job's (user code), never the node's
    (result("failed", node(0, 1), node(1, -9)),
     {0: share_exit(0, 1, at=4), 1: share_exit(1, -signal.SIGKILL, at=5)}, 1,
     FailureKind.SIGNALLED, 1),
    (result("failed", node(0, -7)), {0: share_exit(0, -signal.SIGBUS, at=3)}, 1,
     FailureKind.SIGNALLED, 0),
    # SIGKILL sent by the executor while stopping a cancelled share: not a node fault
    (result("failed", node(0, 1), node(1, -9)),
     {0: share_exit(0, 1, at=4), 1: share_exit(1, -9, at=5, cancelled=True)}, 1,
     FailureKind.CODE, 0),
    # a segfault is the code's
    (result("failed", node(0, -11)), {0: share_exit(0, -11, at=3)}, 1, FailureKind.CODE, 0),
    # the first share that failed by itself, not the ones stopped after it
    (result("failed", node(0, -15), node(1, 2)),
     {0: share_exit(0, -15, at=9, cancelled=True), 1: share_exit(1, 2, at=8)}, 1,
     FailureKind.CODE, 1),
    (None, {}, 3, FailureKind.NODE_LOST, None),
    (None, {}, 2, FailureKind.CODE, None),
    (None, {}, None, FailureKind.RUNNER_LOST, None),  # seen only through its heartbeat
    # the runner (the product's process, not the job's) killed by a signal: never the code's
    (None, {}, -signal.SIGKILL, FailureKind.RUNNER_LOST, None),
    # an executor that restarted stopped the share it found running: the product's fault,
    # not the code's (its peers failed by consequence) nor the node's (SIGKILL by us)
    (result("failed", node(0, 1), node(1, -9, EXECUTOR_RESTARTED_REASON + "; stopped")),
     {0: share_exit(0, 1, at=4), 1: share_exit(1, -9, at=5, cancelled=True,
                                                reason=EXECUTOR_RESTARTED_REASON + "; x")},
     1, FailureKind.EXECUTOR_RESTARTED, 1),
])
def test_classify(res, exits, runner_code, kind, rank):
    failure = classify(res, exits, runner_code=runner_code)
    if kind is None:
        assert failure is None
    else:
        assert failure is not None and failure.kind is kind, failure
        assert failure.rank == rank


def test_every_kind_has_one_of_the_five_classes():
    assert {k.failure_class for k in FailureKind} == set(FailureClass)
    assert {k for k in FailureKind if k.failure_class is FailureClass.INFRASTRUCTURE} == {
        FailureKind.MASTER_LOST, FailureKind.EXECUTOR_RESTARTED, FailureKind.RUNNER_LOST,
        FailureKind.NETWORK, FailureKind.IMAGE_PULL}


@pytest.mark.parametrize(("restarts", "action"), [(0, Action.RESTART), (2, Action.RESTART),
                                                  (3, Action.FAIL)])
def test_an_infrastructure_fault_is_retried_within_max_restarts_not_as_code(restarts, action):
    decision = decide(INFRA, restarts=restarts, code_restarts=0, policy=Policy())
    assert decision.action is action, decision
    assert "infrastructure" in decision.reason


def test_an_exit_the_executor_marks_infrastructure_is_classified_so():
    """The contract between the executor and the classifier: a share whose end the executor
    could not observe (its status lost across a restart, EFS full) carries
    ``fault="infrastructure"`` (tests/executor/test_faults.py checks the executor writes it);
    the classifier must then blame neither the code nor the node."""
    rec = ShareExit(rank=0, address="10.0.1.1", returncode=1, fault=FAULT_INFRASTRUCTURE,
                    reason="the job executor restarted while the share ran; its status is lost")
    res = result("failed", NodeResult(rank=0, address="10.0.1.1", returncode=1,
                                      reason=rec.reason))
    failure = classify(res, {0: rec})
    assert failure is not None and failure.failure_class is FailureClass.INFRASTRUCTURE
    assert not failure.kind.node_fault


def test_node_faults_are_exactly_the_two_node_kinds():
    """A job's exit signal is never a node fault: any user's process can SIGKILL itself."""
    assert {k for k in FailureKind if k.node_fault} == {
        FailureKind.NODE_LOST, FailureKind.NODE_UNHEALTHY}
    assert FailureKind.SIGNALLED.failure_class is FailureClass.USER_CODE


def test_a_join_restarts_the_workers_only_when_the_rendezvous_has_room():
    """A node joining a full round (MAX nodes in) waits as a spare and nobody restarts, so
    the hang watch gives no restart grace then; below MAX torchrun restarts every worker."""
    assert not join_restarts_workers(parse_nnodes("1:4"), 4)  # a spare run, full again
    assert join_restarts_workers(parse_nnodes("1:4"), 3)  # one short: the joiner is taken in
    assert join_restarts_workers(parse_nnodes("1:64"), 63)
    assert not join_restarts_workers(parse_nnodes("1:64"), 64)
    assert join_restarts_workers(parse_nnodes("2"), 1)


@pytest.mark.parametrize(("given", "nodes", "members", "restarts"), [
    ("", 4, 3, True),  # the default MAX (64) on a small cluster: room
    ("", 64, 64, False),  # 64 nodes, all in: a joiner waits as a spare
    ("", 70, 64, True),  # more than 64 nodes: MAX is the node count, 64 in leaves room
    ("", 70, 69, True),
    ("", 70, 70, False),
    ("1:4", 5, 4, False),  # MAX below the node count: full at 4
])
def test_a_join_on_an_elastic_attempt_uses_the_launchers_own_max(given, nodes, members,
                                                                  restarts):
    """The hang watch's question is asked of the range the launcher gave the attempt
    (``node_range``, published in its spec), not of a default of its own: on a cluster of
    more than 64 nodes an elastic job without --nnodes runs with MAX = its node count, and
    a join while 64 to MAX-1 nodes are in restarts every worker (the grace is due)."""
    nnodes = node_range(given, nodes, elastic=True)
    assert join_restarts_workers(nnodes, members) is restarts

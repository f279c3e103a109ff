"""What a managed job does next: pure decisions, no I/O, tested as tables.

The job controller (``controller.py``) feeds these functions what it read from EFS (the
attempt's ``result.json`` and share exits, the membership, the clock) and acts on the
answer. Keeping the decisions here, free of files and AWS, is what lets every rule of the
restart policy be read and tested in one place.

States of a managed job::

    queued ──▶ running ──▶ succeeded
                 │  ▲  └─▶ failed | cancelled | budget
                 ▼  │
              restarting ──▶ failed | cancelled | budget

``budget``: the job's cost reached its ``--max-cost``; the controller stopped it as a cancel
does (SIGTERM, the grace period for a last checkpoint) and it is not restarted.

How an attempt failed comes from the one classifier (``classify``: user-code, node-lost,
node-unhealthy, cancelled, infrastructure, budget). Node faults and infrastructure faults (the
product's own: a restarted executor, a lost controller) are retried up to
``--max-restarts``; a user-code failure only up to ``--max-code-restarts`` (default 0: the
same code on healthy nodes fails again), and it counts against both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from bootstrap_scripts.jobs.engine.classify import Failure, FailureClass
from bootstrap_scripts.protocol.nnodes import NodeRange

DEFAULT_MAX_RESTARTS = 3
DEFAULT_MAX_CODE_RESTARTS = 0
#: How long a restart waits for Auto Scaling to replace a node (AWS: terminate, launch,
#: boot, join: minutes).
DEFAULT_REPLACE_TIMEOUT = 900.0


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BUDGET = "budget"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                        JobState.BUDGET)


#: Every allowed transition; the controller checks each one (:func:`check_transition`).
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.RESTARTING, JobState.FAILED,
                                JobState.CANCELLED, JobState.BUDGET}),
    JobState.RUNNING: frozenset({JobState.RUNNING, JobState.RESTARTING, JobState.SUCCEEDED,
                                 JobState.FAILED, JobState.CANCELLED, JobState.BUDGET}),
    JobState.RESTARTING: frozenset({JobState.RUNNING, JobState.RESTARTING, JobState.FAILED,
                                    JobState.CANCELLED, JobState.BUDGET}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.BUDGET: frozenset(),
}


def check_transition(old: JobState, new: JobState) -> JobState:
    """``new`` if the machine allows ``old -> new``, else ValueError naming both."""
    if new not in TRANSITIONS[old]:
        raise ValueError(f"a managed job cannot go from {old.value} to {new.value}")
    return new


@dataclass(frozen=True)
class Policy:
    """A job's restart policy (``dl-run --max-restarts ...``)."""

    max_restarts: int = DEFAULT_MAX_RESTARTS
    min_nodes: int = 0  # 0: the first attempt's node count
    max_code_restarts: int = DEFAULT_MAX_CODE_RESTARTS
    replace_timeout: float = DEFAULT_REPLACE_TIMEOUT
    #: ``--elastic``: the job runs under torchrun ``--nnodes MIN:MAX``, so it can start on
    #: fewer nodes and take a replacement in while it runs (``elastic_min``: MIN)
    elastic: bool = False
    elastic_min: int = 1

    def __post_init__(self) -> None:
        for name in ("max_restarts", "min_nodes", "max_code_restarts"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, "
                                 f"got {getattr(self, name)}")
        if self.replace_timeout < 0:
            raise ValueError(f"--replace-timeout must be >= 0 s, got {self.replace_timeout}")
        if self.elastic_min < 1:
            raise ValueError(f"--nnodes MIN must be >= 1, got {self.elastic_min}")

    def minimum(self, full_size: int) -> int:
        """The fewest nodes an attempt runs on: ``--min-nodes`` (default: all of them); an
        elastic job's default is torchrun's ``--nnodes`` MIN, and it is never below MIN
        (torchrun would not form a rendezvous with fewer)."""
        if self.elastic:
            return min(max(self.min_nodes, self.elastic_min), full_size)
        return min(self.min_nodes or full_size, full_size)


class Action(StrEnum):
    SUCCEED = "succeed"
    RESTART = "restart"
    FAIL = "fail"
    CANCEL = "cancel"
    STOP_BUDGET = "stop-budget"


@dataclass(frozen=True)
class Decision:
    action: Action
    state: JobState
    reason: str


def describe(failure: Failure) -> str:
    """``kind: detail``, with the class when it says more than the kind."""
    cls = failure.failure_class.value
    head = failure.kind.value if cls == failure.kind.value else f"{failure.kind.value} ({cls})"
    return f"{head}: {failure.detail}"


def decide(failure: Failure | None, *, restarts: int, code_restarts: int, policy: Policy,
           cancel_requested: bool = False) -> Decision:
    """After an attempt ended (``failure`` None: it succeeded): succeed, restart, fail or
    cancel. ``restarts``/``code_restarts``: restarts done so far."""
    if failure is not None and failure.failure_class is FailureClass.BUDGET:
        return Decision(Action.STOP_BUDGET, JobState.BUDGET, failure.detail)
    if cancel_requested or (failure and failure.failure_class is FailureClass.CANCELLED):
        return Decision(Action.CANCEL, JobState.CANCELLED, "cancelled by the user")
    if failure is None:
        return Decision(Action.SUCCEED, JobState.SUCCEEDED, "every node succeeded")
    if restarts >= policy.max_restarts:
        return Decision(Action.FAIL, JobState.FAILED,
                        f"{describe(failure)}; no restart left "
                        f"({restarts} of --max-restarts {policy.max_restarts} used)")
    if failure.failure_class in (FailureClass.USER_CODE, FailureClass.INPUT) and \
            code_restarts >= policy.max_code_restarts:
        return Decision(Action.FAIL, JobState.FAILED,
                        f"{describe(failure)}; a failure of the command on healthy nodes "
                        f"is not retried (--max-code-restarts {policy.max_code_restarts})")
    return Decision(Action.RESTART, JobState.RESTARTING,
                    f"{describe(failure)}; restart {restarts + 1} of "
                    f"{policy.max_restarts}")


class World(StrEnum):
    WAIT = "wait"  # a replacement is still expected
    FULL = "full"  # run at full size
    SURVIVORS = "survivors"  # run on fewer nodes (>= min-nodes)
    #: elastic: run on the survivors now; a replacement joins the running attempt once it
    #: passed the health gate (TorchElastic's membership change), no waiting for it
    SURVIVORS_NOW = "survivors-now"
    FAIL = "fail"  # too few nodes, and no more waiting


@dataclass(frozen=True)
class WorldChoice:
    world: World
    reason: str


def choose_world(*, full_size: int, ready: int, waited: float, policy: Policy) -> WorldChoice:
    """On how many nodes the next attempt runs: all of them once the cluster is back at
    ``full_size``. While fewer are ready: an elastic job runs on the ``ready`` survivors at
    once when they are at least its minimum (the replacement joins the running attempt
    later, through torchrun's rendezvous); any other job waits up to ``--replace-timeout``
    for the replacement, then runs on the survivors if they are at least ``--min-nodes``."""
    if ready >= full_size:
        return WorldChoice(World.FULL, f"{ready} node(s) ready")
    minimum = policy.minimum(full_size)
    if policy.elastic and ready >= minimum and ready > 0:
        return WorldChoice(World.SURVIVORS_NOW, f"restarting on {ready} of {full_size} "
                           f"node(s) now (elastic, minimum {minimum}); the replacement joins "
                           f"when ready (once it passed the health gate)")
    if waited < policy.replace_timeout:
        return WorldChoice(World.WAIT, f"{ready} of {full_size} node(s) ready; waiting up to "
                           f"{policy.replace_timeout:.0f} s for a replacement")
    if ready >= minimum and ready > 0:
        return WorldChoice(World.SURVIVORS, f"no replacement after {waited:.0f} s: running on "
                           f"the {ready} surviving node(s) (--min-nodes {minimum})")
    return WorldChoice(World.FAIL, f"only {ready} of {full_size} node(s) ready after waiting "
                       f"{waited:.0f} s for a replacement (--min-nodes {minimum})")


def join_restarts_workers(nodes: NodeRange, members_before: int) -> bool:
    """Does a node joining a running elastic attempt restart its workers? Only when the
    rendezvous has room: ``members_before`` (the attempt's live nodes before the join) below
    torchrun's ``--nnodes`` MAX. At MAX the joiner goes on the redundancy list as a spare
    and nobody restarts (docs/elastic-training.md, "Spare nodes"), so the hang watch must
    not give the workers a restart's grace. ``nodes``: the attempt's own range, as its
    launcher computed and published it (``JobSpec.nnodes``), never worked out again from
    the request: with no ``--nnodes`` MAX depends on the attempt's node count."""
    return nodes.has_room(members_before)

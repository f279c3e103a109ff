"""What a managed job does next: pure decisions, no I/O, tested as tables.

The job controller (``controller.py``) feeds these functions what it read from EFS (the
attempt's ``result.json`` and share exits, the membership, the clock) and acts on the
answer. Keeping the decisions here, free of files and AWS, is what lets every rule of the
restart policy be read and tested in one place.

States of a managed job::

    queued ──▶ running ──▶ succeeded
                 │  ▲  └─▶ failed | cancelled
                 ▼  │
              restarting ──▶ failed | cancelled

Failure kinds (from the attempt's records):
- ``node-lost``: a node's executor heartbeat stopped, or its share was never started;
- ``node-signal``: a node's share was killed by SIGKILL or SIGBUS (the kernel's OOM killer,
  a machine going away, a hardware fault), not by the job's cancel;
- ``node-unhealthy``: the node failed the health gate;
- ``code``: the command exited non-zero (or by another signal) on healthy nodes;
- ``master-lost``: a new controller found the job's attempt orphaned (master replaced);
- ``cancelled``: the user cancelled the job.
Node faults (and a lost master) are retried up to ``--max-restarts``; a code failure only
up to ``--max-code-restarts`` (default 0: the same code on healthy nodes fails again).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from bootstrap_scripts.protocol.records import JobResult, ShareExit

DEFAULT_MAX_RESTARTS = 3
DEFAULT_MAX_CODE_RESTARTS = 0
#: How long a restart waits for Auto Scaling to replace a node (AWS: terminate, launch,
#: boot, join: minutes).
DEFAULT_REPLACE_TIMEOUT = 900.0
#: Signals that say "the machine or the kernel killed it", not "the program crashed".
NODE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGBUS})


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


#: Every allowed transition; the controller checks each one (:func:`check_transition`).
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.RESTARTING, JobState.FAILED,
                                JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.RUNNING, JobState.RESTARTING, JobState.SUCCEEDED,
                                 JobState.FAILED, JobState.CANCELLED}),
    JobState.RESTARTING: frozenset({JobState.RUNNING, JobState.RESTARTING, JobState.FAILED,
                                    JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def check_transition(old: JobState, new: JobState) -> JobState:
    """``new`` if the machine allows ``old -> new``, else ValueError naming both."""
    if new not in TRANSITIONS[old]:
        raise ValueError(f"a managed job cannot go from {old.value} to {new.value}")
    return new


class FailureKind(StrEnum):
    NODE_LOST = "node-lost"
    NODE_SIGNAL = "node-signal"
    NODE_UNHEALTHY = "node-unhealthy"
    CODE = "code"
    MASTER_LOST = "master-lost"
    CANCELLED = "cancelled"

    @property
    def node_fault(self) -> bool:
        """The node is at fault: it is marked unhealthy and replaced."""
        return self in (FailureKind.NODE_LOST, FailureKind.NODE_SIGNAL,
                        FailureKind.NODE_UNHEALTHY)


@dataclass(frozen=True)
class Policy:
    """A job's restart policy (``dl-run --max-restarts ...``)."""

    max_restarts: int = DEFAULT_MAX_RESTARTS
    min_nodes: int = 0  # 0: the first attempt's node count
    max_code_restarts: int = DEFAULT_MAX_CODE_RESTARTS
    replace_timeout: float = DEFAULT_REPLACE_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("max_restarts", "min_nodes", "max_code_restarts"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, "
                                 f"got {getattr(self, name)}")
        if self.replace_timeout < 0:
            raise ValueError(f"--replace-timeout must be >= 0 s, got {self.replace_timeout}")

    def minimum(self, full_size: int) -> int:
        return min(self.min_nodes or full_size, full_size)


@dataclass(frozen=True)
class Failure:
    """Why an attempt did not succeed, and which node (if a node is to blame)."""

    kind: FailureKind
    detail: str
    address: str = ""
    instance_id: str = ""
    rank: int | None = None


def classify(result: JobResult | None, exits: Mapping[int, ShareExit], *,
             runner_code: int | None = None) -> Failure | None:
    """The failure of a finished attempt (None: it succeeded).

    ``result`` is the attempt's ``result.json`` and ``exits`` its shares' exit records;
    ``runner_code`` the attempt runner's exit status (for an attempt that ended without a
    result, e.g. a node unreachable at its start). A node to blame wins over a code
    failure: when a node is lost or killed, its peers fail too, by consequence."""
    if result is None:
        if runner_code == 3:
            return Failure(FailureKind.NODE_LOST, "a node was unreachable when the attempt "
                           "started (no executor heartbeat)")
        return Failure(FailureKind.CODE, f"the attempt's runner exited with code "
                       f"{runner_code} without a result")
    if result.status == "succeeded":
        return None
    if result.status == "cancelled":
        return Failure(FailureKind.CANCELLED, "the attempt was cancelled")
    lost = [n for n in result.nodes if n.returncode is None and not n.left]
    if lost:
        n = lost[0]
        return Failure(FailureKind.NODE_LOST, n.reason or "no exit recorded", n.address,
                       rank=n.rank)
    killed = [e for e in sorted(exits.values(), key=lambda e: (e.finished_at, e.rank))
              if not e.cancelled and e.signal in NODE_SIGNALS]
    if killed:
        e = killed[0]
        return Failure(FailureKind.NODE_SIGNAL, f"node rank {e.rank} ({e.address}): share "
                       f"killed by {signal.Signals(e.signal).name}", e.address, rank=e.rank)
    failed = [n for n in result.nodes if n.returncode not in (None, 0) and not n.left]
    own = [n for n in failed if not (exits.get(n.rank) and exits[n.rank].cancelled)]
    first = min(own or failed, key=lambda n: (
        exits[n.rank].finished_at if n.rank in exits else 0.0, n.rank), default=None)
    if first is None:
        return Failure(FailureKind.CODE, "the attempt failed")
    return Failure(FailureKind.CODE, f"node rank {first.rank} ({first.address}) exited with "
                   f"code {first.returncode}" + (f" ({first.reason})" if first.reason else ""),
                   first.address, rank=first.rank)


class Action(StrEnum):
    SUCCEED = "succeed"
    RESTART = "restart"
    FAIL = "fail"
    CANCEL = "cancel"


@dataclass(frozen=True)
class Decision:
    action: Action
    state: JobState
    reason: str


def decide(failure: Failure | None, *, restarts: int, code_restarts: int, policy: Policy,
           cancel_requested: bool = False) -> Decision:
    """After an attempt ended (``failure`` None: it succeeded): succeed, restart, fail or
    cancel. ``restarts``/``code_restarts``: restarts done so far."""
    if cancel_requested or (failure and failure.kind is FailureKind.CANCELLED):
        return Decision(Action.CANCEL, JobState.CANCELLED, "cancelled by the user")
    if failure is None:
        return Decision(Action.SUCCEED, JobState.SUCCEEDED, "every node succeeded")
    if restarts >= policy.max_restarts:
        return Decision(Action.FAIL, JobState.FAILED,
                        f"{failure.kind.value}: {failure.detail}; no restart left "
                        f"({restarts} of --max-restarts {policy.max_restarts} used)")
    if failure.kind is FailureKind.CODE and code_restarts >= policy.max_code_restarts:
        return Decision(Action.FAIL, JobState.FAILED,
                        f"code: {failure.detail}; a failure of the command on healthy nodes "
                        f"is not retried (--max-code-restarts {policy.max_code_restarts})")
    return Decision(Action.RESTART, JobState.RESTARTING,
                    f"{failure.kind.value}: {failure.detail}; restart {restarts + 1} of "
                    f"{policy.max_restarts}")


class World(StrEnum):
    WAIT = "wait"  # a replacement is still expected
    FULL = "full"  # run at full size
    SURVIVORS = "survivors"  # run on fewer nodes (>= min-nodes)
    FAIL = "fail"  # too few nodes, and no more waiting


@dataclass(frozen=True)
class WorldChoice:
    world: World
    reason: str


def choose_world(*, full_size: int, ready: int, waited: float, policy: Policy) -> WorldChoice:
    """On how many nodes the next attempt runs: all of them once the cluster is back at
    ``full_size``; while fewer are ready, wait up to ``--replace-timeout`` for the
    replacement, then run on the ``ready`` survivors if they are at least ``--min-nodes``."""
    if ready >= full_size:
        return WorldChoice(World.FULL, f"{ready} node(s) ready")
    if waited < policy.replace_timeout:
        return WorldChoice(World.WAIT, f"{ready} of {full_size} node(s) ready; waiting up to "
                           f"{policy.replace_timeout:.0f} s for a replacement")
    minimum = policy.minimum(full_size)
    if ready >= minimum and ready > 0:
        return WorldChoice(World.SURVIVORS, f"no replacement after {waited:.0f} s: running on "
                           f"the {ready} surviving node(s) (--min-nodes {minimum})")
    return WorldChoice(World.FAIL, f"only {ready} of {full_size} node(s) ready after waiting "
                       f"{waited:.0f} s for a replacement (--min-nodes {minimum})")

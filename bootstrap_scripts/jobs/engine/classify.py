"""Why a job's attempt did not succeed: the one classifier of outcomes (pure, no I/O).

Both ends of a run use it: the runner's summary names the class in its final message and
returns it in the :class:`~bootstrap_scripts.jobs.engine.run.Verdict`, and the job
controller's restart policy decides on it. Whoever reads the same ``result.json`` and share
exits gets the same answer.

The classes (``FailureClass``), and who is to blame:

- ``user-code``: the command exited non-zero, or died by a signal (SIGKILL and SIGBUS
  included), on nodes whose root-run machinery is healthy. A job's exit signal alone never
  blames the node: any user's process can SIGKILL itself, so reading it as a node fault would
  let every user get healthy instances replaced (the OOM killer stopping a job that asked
  for too much memory is the job's failure too);
- ``node-lost``: a node stopped answering (its executor heartbeat stopped, or it never
  started its share); the job controller confirms it from the executor's heartbeat (root's
  record) before it blames the node;
- ``node-unhealthy``: the node failed the (root-run) health gate;
- ``cancelled``: the user (or the runner's signal) cancelled the job;
- ``budget``: the job controller stopped the job because its cost reached the job's
  ``--max-cost`` (``ops/cost.check_cap``), the way a cancel stops it; never restarted;
- ``infrastructure``: the product's own fault, not the user's nor the machine's: a job
  executor that restarted and stopped the share it found running, an attempt's runner that
  vanished (or was killed by a signal) without a result, a job controller lost with its
  attempt. Retried like a node
  fault; no node is blamed;
- ``infrastructure`` (``network``) too: a node's ranks failed on the network between them,
  not on their code: its last error line is torchrun's rendezvous store out of reach, a gloo
  connection reset or closed by its peer, NCCL's remote error (:func:`network_error`; the
  runner notes it in the node's result). A code failure on any node wins over it (its peers
  then lose their connections by consequence);
- ``infrastructure`` (``image-pull``) too: a node could not pull the job's image before
  any rank started (not found, access denied, disk full, registry unreachable, throttled:
  ``jobs/engine/image_pull.py``). The job's command never ran;
- ``input``: the job's input could not be made ready before its command ran: staging its
  ``--data`` on the nodes, or restoring its checkpoint (a wrong prefix, AccessDenied). Not
  the code's (the command never ran) nor a node's; retried no more than a code failure;
- ``hang``: no rank made progress for the job's ``--hang-timeout`` (the job controller
  judged it, dumped every rank's stack and stopped the attempt). Neither the code's fault
  alone (a collective that never returns is often the network's) nor a node's on its own
  evidence: retried like a node fault, and the health gate before the next attempt (its
  all-reduce among them) leaves out a node that fails it.

A ``FailureKind`` is the precise cause recorded in a restart record (``signalled``,
``master-lost``, ...); each kind belongs to one class.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from bootstrap_scripts.jobs.engine.outcomes import EXIT_UNREACHABLE
from bootstrap_scripts.protocol.jobs import EXECUTOR_RESTARTED_REASON
from bootstrap_scripts.protocol.records import (
    FAULT_INFRASTRUCTURE,
    JobResult,
    NodeResult,
    ShareExit,
)

#: Signals that usually mean "something killed it" rather than "the program crashed": the
#: likely cause when several shares failed (their peers then fail by consequence), but the
#: job's own failure all the same (a user's process can send them to itself).
KILL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGBUS})
#: A rank's last error line that says the network between the ranks failed, not its code:
#: torchrun's rendezvous store out of reach, c10d's own network errors, a gloo pair reset or
#: closed by its peer, NCCL's remote error.
NETWORK_ERROR_RE = re.compile(
    r"RendezvousConnectionError|DistNetworkError|Connection reset by peer|"
    r"Connection closed by peer|ncclRemoteError|remote process exited or there was a "
    r"network error|NCCL communicator was aborted|No route to host|Network is unreachable|"
    r"connectFullMesh failed", re.IGNORECASE)
#: How the runner begins the result's reason of a node whose ranks failed on the network.
NETWORK_REASON = "network error"


def network_error(line: str) -> bool:
    """Whether a rank's last error line is the network's failure (pure)."""
    return bool(NETWORK_ERROR_RE.search(line))


class FailureClass(StrEnum):
    USER_CODE = "user-code"
    NODE_LOST = "node-lost"
    NODE_UNHEALTHY = "node-unhealthy"
    CANCELLED = "cancelled"
    INFRASTRUCTURE = "infrastructure"
    BUDGET = "budget"
    HANG = "hang"
    INPUT = "input"


class FailureKind(StrEnum):
    NODE_LOST = "node-lost"
    SIGNALLED = "signalled"
    NODE_UNHEALTHY = "node-unhealthy"
    CODE = "code"
    MASTER_LOST = "master-lost"
    EXECUTOR_RESTARTED = "executor-restarted"
    RUNNER_LOST = "runner-lost"
    CANCELLED = "cancelled"
    BUDGET = "budget"
    HANG = "hang"
    NETWORK = "network"
    INPUT = "input"
    IMAGE_PULL = "image-pull"

    @property
    def failure_class(self) -> FailureClass:
        return _CLASS_OF[self]

    @property
    def node_fault(self) -> bool:
        """The node is at fault: it is marked unhealthy and replaced."""
        return self.failure_class in (FailureClass.NODE_LOST, FailureClass.NODE_UNHEALTHY)


_CLASS_OF = {
    FailureKind.NODE_LOST: FailureClass.NODE_LOST,
    FailureKind.SIGNALLED: FailureClass.USER_CODE,
    FailureKind.NODE_UNHEALTHY: FailureClass.NODE_UNHEALTHY,
    FailureKind.CODE: FailureClass.USER_CODE,
    FailureKind.MASTER_LOST: FailureClass.INFRASTRUCTURE,
    FailureKind.EXECUTOR_RESTARTED: FailureClass.INFRASTRUCTURE,
    FailureKind.RUNNER_LOST: FailureClass.INFRASTRUCTURE,
    FailureKind.CANCELLED: FailureClass.CANCELLED,
    FailureKind.BUDGET: FailureClass.BUDGET,
    FailureKind.HANG: FailureClass.HANG,
    FailureKind.NETWORK: FailureClass.INFRASTRUCTURE,
    FailureKind.INPUT: FailureClass.INPUT,
    FailureKind.IMAGE_PULL: FailureClass.INFRASTRUCTURE,
}


@dataclass(frozen=True)
class Failure:
    """Why an attempt did not succeed, and which node (if a node is to blame)."""

    kind: FailureKind
    detail: str
    address: str = ""
    instance_id: str = ""
    rank: int | None = None

    @property
    def failure_class(self) -> FailureClass:
        return self.kind.failure_class


@dataclass(frozen=True)
class Verdict:
    """How a run ended (what :func:`~bootstrap_scripts.jobs.engine.run.run` returns):
    ``status`` (succeeded | failed | cancelled), the exit status ``dl-run`` returns, and
    the classified cause (None when it succeeded)."""

    job_id: str
    status: str
    exit_code: int
    failure: Failure | None = None


def node_kind(node: NodeResult, exit_rec: ShareExit | None) -> FailureKind | None:
    """What went wrong on one node of a finished job (None: nothing, or it left an elastic
    job). ``cancelled`` means the node's share was stopped because of someone else."""
    if node.left or node.returncode == 0:
        return None
    if node.returncode is None:
        return FailureKind.NODE_LOST
    if exit_rec is not None and (exit_rec.fault == FAULT_INFRASTRUCTURE
                                 or exit_rec.reason.startswith(EXECUTOR_RESTARTED_REASON)):
        return FailureKind.EXECUTOR_RESTARTED  # the executor lost track of it, not the code
    if exit_rec is not None and exit_rec.cancelled:
        return FailureKind.CANCELLED
    if exit_rec is not None and exit_rec.signal in KILL_SIGNALS:
        return FailureKind.SIGNALLED
    if node.reason.startswith(NETWORK_REASON):
        return FailureKind.NETWORK
    return FailureKind.CODE


#: Which node's fault is the job's cause when several failed: a node to blame (or the
#: product) wins over a code failure (when a node is lost or killed, its peers fail too,
#: by consequence), and a node stopped by the cancel is a cause only when nothing else is.
_PRECEDENCE = (FailureKind.NODE_LOST, FailureKind.EXECUTOR_RESTARTED, FailureKind.SIGNALLED,
               FailureKind.CODE, FailureKind.NETWORK, FailureKind.CANCELLED)


def _detail(kind: FailureKind, node: NodeResult, exit_rec: ShareExit | None) -> str:
    where = f"node rank {node.rank} ({node.address})"
    if kind is FailureKind.NODE_LOST:
        return node.reason or f"{where}: no exit recorded"
    if kind is FailureKind.SIGNALLED and exit_rec is not None:
        return f"{where}: share killed by {signal.Signals(exit_rec.signal).name}"
    if kind is FailureKind.EXECUTOR_RESTARTED and exit_rec is not None:
        return f"{where}: {exit_rec.reason}"
    return f"{where} exited with code {node.returncode}" + (
        f" ({node.reason})" if node.reason else "")


def failing_nodes(result: JobResult, exits: Mapping[int, ShareExit]
                  ) -> list[tuple[FailureKind, NodeResult]]:
    """Every node that failed the job, the cause first (see ``_PRECEDENCE``), then by the
    time each failed and by rank."""
    out = []
    for node in result.nodes:
        kind = node_kind(node, exits.get(node.rank))
        if kind is not None:
            out.append((kind, node))

    def order(item: tuple[FailureKind, NodeResult]) -> tuple[int, float, int]:
        kind, node = item
        rec = exits.get(node.rank)
        return (_PRECEDENCE.index(kind), rec.finished_at if rec else 0.0, node.rank)

    return sorted(out, key=order)


def classify(result: JobResult | None, exits: Mapping[int, ShareExit], *,
             runner_code: int | None = None, cancelled_by: str = "") -> Failure | None:
    """The failure of a finished attempt (None: it succeeded).

    ``result`` is the attempt's ``result.json`` and ``exits`` its shares' exit records;
    ``runner_code`` the runner's exit status, for an attempt that ended without a result
    (a node unreachable at its start: ``node-lost``; None, a runner that vanished (seen
    only through its heartbeat), or negative, one killed by a signal (``kill -9``, the OOM
    killer: the runner is the product's process, the job's code never runs in it):
    ``runner-lost``; anything else, e.g. options the launcher refused: ``code``).
    ``cancelled_by``: the reason of a cancel sent from outside the runner (the job's cancel
    marker: a user's cancel, the cost cap, the job controller): shares it stopped are that
    cancel, not the code."""
    if result is None and runner_code is None:
        return Failure(FailureKind.RUNNER_LOST, "the attempt's runner stopped without a "
                       "result (its heartbeat went silent)")
    if result is None and runner_code < 0:
        return Failure(FailureKind.RUNNER_LOST, f"the attempt's runner was killed by "
                       f"{_signal_name(-runner_code)} without a result")
    if result is None:
        if runner_code == EXIT_UNREACHABLE:
            return Failure(FailureKind.NODE_LOST, "a node was unreachable when the attempt "
                           "started (no executor heartbeat)")
        return Failure(FailureKind.CODE, f"the attempt's runner exited with code "
                       f"{runner_code} without a result")
    if result.status == "succeeded":
        return None
    if result.status == "cancelled":
        return Failure(FailureKind.CANCELLED, "the attempt was cancelled")
    failing = failing_nodes(result, exits)
    if not failing:
        return Failure(FailureKind.CODE, "the attempt failed")
    kind, node = failing[0]
    if kind is FailureKind.CANCELLED and cancelled_by:  # only nodes that cancel stopped
        return Failure(FailureKind.CANCELLED, cancelled_by)
    if kind is FailureKind.CANCELLED:  # only stopped nodes: the one that failed first
        kind = FailureKind.CODE
    return Failure(kind, _detail(kind, node, exits.get(node.rank)), node.address,
                   rank=node.rank)


def as_input(failure: Failure | None, what: str) -> Failure | None:
    """The failure of a job's input step (``what``: staging its data, restoring its
    checkpoint) as the job's: ``input``, with the step's own cause quoted."""
    if failure is None or failure.kind is FailureKind.CANCELLED:
        return failure
    return Failure(FailureKind.INPUT, f"{what} failed: {failure.detail}", failure.address,
                   rank=failure.rank)


def budget_stop(failure: Failure | None, reason: str) -> Failure | None:
    """How an attempt the controller stopped at the job's cost cap ended: ``budget`` whatever
    the stop made of it (cancelled shares, a rank that died of the SIGTERM), unless it
    succeeded anyway (it finished as the cap was reached: the work is done)."""
    if failure is None:
        return None
    return Failure(FailureKind.BUDGET, reason)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

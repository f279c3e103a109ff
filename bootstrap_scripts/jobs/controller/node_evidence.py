"""Whether a failed attempt may cost a node its instance: root-side evidence only.

An attempt's outcome (``result.json``, written by the attempt's runner) comes from the job's
own user: the controller starts each attempt's runner with the uid of the user who
submitted the job, and the job's processes belong to that user too. Nothing in it is
evidence against a node: a user's process can SIGKILL itself (the classifier calls that
user code) and a user's runner can write "node lost" for any node. So before the controller
marks an instance Unhealthy after an attempt (Auto Scaling then terminates it) it asks
root's own record, the node's job executor heartbeat (``cluster/executors/<address>.json``,
written by the root executor on that node and judged by :mod:`bootstrap_scripts.protocol.
liveness`): only an executor that stopped, or went silent while watched from here, is a
lost node. The master is never marked by a job's outcome (the controller runs there: a
lost master is seen by the capacity adjuster and EC2's checks, not by a job). The other
root-side evidence, the health gate run by root, marks through ``supervise.run_gate`` what
:func:`gate_verdicts` lets it: a node's own check names that node; a collective (the gate's
all-reduce) that failed on several nodes says a link is bad, not which node, so it names
none of them; the master is never marked by the gate either.

:func:`verdict` is the decision table (pure); :func:`executor_gone` the one observation.
:func:`losses` applies the same table to nodes lost while an elastic attempt runs on: the
attempt does not end (torchrun carries on without them), so the controller's own look at
the attempt's executors is the evidence, and the node is marked then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from bootstrap_scripts.jobs.engine.classify import Failure, FailureKind
from bootstrap_scripts.jobs.engine.reachability import read_heartbeat
from bootstrap_scripts.protocol import liveness
from bootstrap_scripts.protocol.managed_records import NodeLoss
from bootstrap_scripts.protocol.membership import Node
from bootstrap_scripts.protocol.records import ExecutorHeartbeat

POLL_SECONDS = 0.5
#: The gate's checks that run across nodes at once: a failure names a link, not a node.
COLLECTIVE_CHECKS = frozenset({"allreduce"})


class Mark(StrEnum):
    """What the controller does with a failed attempt's node."""

    MARK = "mark"  # root's evidence says the node is lost: mark it Unhealthy, exclude it
    NOT_A_NODE_FAULT = "not-a-node-fault"  # the code's, the product's, a cancel
    NO_INSTANCE = "no-instance"  # a node fault without a node to name
    MASTER = "master"  # never by a job's outcome
    EXECUTOR_ALIVE = "executor-alive"  # the job says lost, root's heartbeat says alive


def verdict(failure: Failure, *, instance: str, master_instance: str,
            executor_gone: bool | None) -> tuple[Mark, str]:
    """Mark the instance or not, and why not (``executor_gone``: what
    :func:`executor_gone` saw of the failure's node; None: not looked)."""
    if not failure.kind.node_fault:
        return Mark.NOT_A_NODE_FAULT, ""
    if not instance:
        return Mark.NO_INSTANCE, "no instance id"
    if instance == master_instance:
        return Mark.MASTER, ("not marked: the master is never marked Unhealthy by a job's "
                             "outcome")
    if not executor_gone:
        return Mark.EXECUTOR_ALIVE, (f"not marked: the job executor on {failure.address} is "
                                     f"alive (its heartbeat moves); the attempt's report is "
                                     f"not root's evidence of a lost node")
    return Mark.MARK, ""


def executor_gone(efs: Path, address: str, *, tick: Callable[[], None],
                  silent_after: float = liveness.EXECUTOR_SILENT_SECONDS,
                  read: Callable[[Path, str], ExecutorHeartbeat | None] = read_heartbeat
                  ) -> bool:
    """Watch ``address``'s executor heartbeat until :mod:`liveness` decides: True when it
    stopped, is missing or stayed silent for ``silent_after`` s from here; False as soon as
    it moves. ``tick`` keeps the controller's own heartbeat going meanwhile. ``read``: the
    controller's reader, which believes only the node's own signed beats
    (:mod:`.node_heartbeats`)."""
    last: liveness.Sighting | None = None
    while True:
        state, last = liveness.executor(read(efs, address), last, time.monotonic(),
                                        silent_after)
        if state.gone:
            return True
        if state is liveness.Liveness.ALIVE:
            return False
        tick()
        time.sleep(POLL_SECONDS)


def losses(gone: dict[str, str], *, attempt: int, nodes: Iterable[Node], master_instance: str,
           mark: Callable[[str], str], leaving: Iterable[str] = (),
           now: Callable[[], float] = time.time) -> list[NodeLoss]:
    """Nodes of a running elastic attempt whose executor the controller saw lost (``gone``:
    address -> why, root's evidence): each marked Unhealthy through ``mark`` (instance id ->
    the API's error, "" when done) as :func:`verdict` allows, and recorded. A node
    ``leaving`` (instance ids the master agent is draining: a scale-in) left on purpose: no
    loss."""
    leaving = set(leaving)
    by_address = {}
    for node in nodes:
        by_address.setdefault(node.address, node.instance_id)
    out = []
    for address, why in sorted(gone.items()):
        instance = by_address.get(address, "")
        if instance and instance in leaving:
            continue
        failure = Failure(FailureKind.NODE_LOST, f"executor heartbeat lost ({why}) while the "
                          f"elastic attempt ran: it trains on without the node", address)
        decided, err = verdict(failure, instance=instance, master_instance=master_instance,
                               executor_gone=True)
        if decided is Mark.MARK:
            err = mark(instance)
        out.append(NodeLoss(attempt=attempt, at=now(), address=address, instance_id=instance,
                            detail=failure.detail,
                            marked_unhealthy=decided is Mark.MARK and not err,
                            health_error=err))
    return out


def gate_reason(check: str, detail: str) -> str:
    """How a failed gate check reads in the job's record: ``<check>: <detail>``."""
    return f"{check}: {detail}"


def gate_check(why: str) -> str:
    """The check a :func:`gate_reason` names."""
    return why.partition(":")[0].strip()


@dataclass(frozen=True)
class GateVerdict:
    """One node the gate failed: mark it (and exclude it) or not, and why not."""

    address: str
    instance_id: str
    why: str
    mark: bool
    note: str = ""


def gate_verdicts(failures: Iterable[tuple[str, str, str]], *, master_instance: str,
                  master_address: str = "", passed: int = 0) -> list[GateVerdict]:
    """What the gate's failures (``(address, instance id, gate_reason)``) let the controller
    mark (pure). A node failing a check of its own (GPUs, EFS, ...) is named by it. A node
    failing only a collective is named only when it is the one node that failed it while
    ``passed`` >= 1 other node of the gate passed everything: two or more nodes failing the
    same collective is a bad link (or a peer that does not answer), and nobody is marked
    for it. The master is never marked (the controller runs on it)."""
    by_node: dict[str, tuple[str, list[str]]] = {}
    for address, instance, why in failures:
        by_node.setdefault(address, (instance, []))[1].append(why)
    collective_only = [a for a, (_i, whys) in by_node.items()
                       if all(gate_check(w) in COLLECTIVE_CHECKS for w in whys)]
    out = []
    for address, (instance, whys) in by_node.items():
        why = "; ".join(whys)
        if (instance and instance == master_instance) or address == master_address:
            out.append(GateVerdict(address, instance, why, False,
                                   "not marked: the master is never marked Unhealthy by the "
                                   "gate"))
        elif address in collective_only and (len(collective_only) > 1 or passed < 1):
            out.append(GateVerdict(address, instance, why, False,
                                   f"not marked: the collective failed on "
                                   f"{len(collective_only)} node(s) and names no node (a "
                                   f"link between them, not a node, on this evidence)"))
        elif not instance:
            out.append(GateVerdict(address, instance, why, False, "no instance id"))
        else:
            out.append(GateVerdict(address, instance, why, True))
    return out

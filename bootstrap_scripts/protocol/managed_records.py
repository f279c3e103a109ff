"""Typed records of managed jobs: what a user's ``dl-run`` asks the job controller for
(``managed/<id>/request.json``), the controller's record of the job and its restarts
(``managed/<id>/job.json``, and its signed copy ``cluster/managed/<user>/<id>.json``), its
heartbeat (``cluster/controller.json``), its circuit breaker (``cluster/breaker.json``) and
its idle stop (``cluster/idle-stop.json``).

They share :class:`~bootstrap_scripts.protocol.record_base.Record`'s (de)serialiser; where they
live on disk: :class:`~bootstrap_scripts.protocol.paths.ManagedPaths`.
"""

from __future__ import annotations

from typing import ClassVar

from bootstrap_scripts.protocol.record_base import Record, record
from bootstrap_scripts.protocol.run_request import RunRequest

# -- managed jobs (under managed/<job-id>/, and the controller's heartbeat) ------------------------


@record
class ManagedRequest(Record):
    """``managed/<id>/request.json``: a user's ``dl-run`` asks the job controller to run a job
    (written last by the submitter; its owner is the user the attempts run as)."""

    KIND: ClassVar[str] = "managed job request"
    job_id: str
    #: what every attempt runs (its ``job_id`` is the job's; attempt n runs as ``<id>.<n>``)
    run: RunRequest
    submitted_at: float
    user: str = ""
    world_size: int = 0  # nodes in the membership at submission
    max_restarts: int = 3
    min_nodes: int = 0  # 0: every node of the first attempt
    max_code_restarts: int = 0
    replace_timeout: float = 900.0
    #: ``--max-cost``: USD the job may spend (its nodes' seconds x their prices, ``ops/cost``);
    #: "" = no cap. Reached, the controller stops the job as a cancel does (outcome budget).
    max_cost_usd: str = ""


@record
class RestartRecord(Record):
    """One restart of a managed job (in ``job.json``): why, which node, how long it took."""

    KIND: ClassVar[str] = "restart record"
    attempt: int  # the attempt that failed
    at: float  # when the controller detected the failure
    kind: str  # node-lost | signalled | node-unhealthy | code | master-lost | ...
    detail: str = ""
    address: str = ""
    instance_id: str = ""
    marked_unhealthy: bool = False
    health_error: str = ""
    replacement_instance_id: str = ""
    next_world_size: int = 0
    seconds_to_resume: float | None = None  # detection -> every share of the next attempt up
    resumed_epoch: int | None = None
    resumed_step: int | None = None
    #: how the next attempt's nodes were chosen (``restart_policy.World``: full, survivors
    #: after --replace-timeout, survivors-now for an elastic job) and the job's full size
    world: str = ""
    full_size: int = 0
    #: elastic, survivors-now: replacement(s) the health gate passed and admitted into the
    #: running attempt, and when they joined it (their share started: the job grew back)
    admitted_instance_ids: str = ""
    joined_at: float | None = None


@record
class NodeLoss(Record):
    """A node lost while an elastic attempt ran on (in ``job.json``): the attempt did not
    end (torchrun carried on without it), so no restart record says so; root's own
    evidence (its executor heartbeat lost) did, and the controller marked it Unhealthy."""

    KIND: ClassVar[str] = "node loss"
    attempt: int  # the attempt that trained on without it
    at: float  # when the controller saw its executor heartbeat lost
    address: str = ""
    instance_id: str = ""
    detail: str = ""
    marked_unhealthy: bool = False
    health_error: str = ""  # why it was not marked (the master, the API's error)


@record
class NodeUsage(Record):
    """One node of an attempt and the price its instance was bought at (``ops/prices``)."""

    KIND: ClassVar[str] = "node usage"
    instance_id: str
    instance_type: str = ""
    market: str = ""  # on-demand | spot | reservation | capacity-block ("" unknown)
    zone: str = ""
    usd_per_hour: str = ""  # exact decimal; "" = unknown (price_note says why)
    price_note: str = ""
    #: an elastic attempt's node that joined it while it ran: charged from then, not from
    #: the attempt's start (None: one of the nodes it started on)
    joined_at: float | None = None
    #: a node lost while the attempt trained on without it: charged until then, not to the
    #: attempt's end (None: it ran to the end)
    left_at: float | None = None


@record
class AttemptUsage(Record):
    """One attempt's place in the job's cost ledger: when it ran and on which nodes."""

    KIND: ClassVar[str] = "attempt usage"
    attempt: int
    started_at: float
    ended_at: float | None = None  # None while it runs
    nodes: tuple[NodeUsage, ...] = ()


@record
class ManagedJob(Record):
    """``managed/<id>/job.json``: the job controller's record of a managed job."""

    KIND: ClassVar[str] = "managed job"
    job_id: str
    state: str  # queued | running | restarting | succeeded | failed | cancelled | budget
    submitted_at: float = 0.0
    updated_at: float = 0.0
    user: str = ""
    attempt: int = 0  # the current (or last) attempt; jobs/<id>.<attempt>/
    restarts: int = 0
    code_restarts: int = 0
    world_size: int = 0  # nodes of the current (or last) attempt
    full_size: int = 0  # the job's size: the membership's at submission
    last_failure: str = ""
    message: str = ""
    controller: str = ""  # "<instance-id>/<pid>" of the controller that runs it
    excluded: tuple[str, ...] = ()  # instance ids the job no longer runs on
    started_at: float | None = None
    finished_at: float | None = None
    restart_log: tuple[RestartRecord, ...] = ()
    #: every node the health gate failed for this job, "<address> (<instance>): <check>:
    #: <detail>" (last_failure keeps only the latest failure of any kind)
    gate_failures: tuple[str, ...] = ()
    #: the cost ledger: every attempt's span and priced nodes (``ops/cost.job_cost`` sums it)
    usage: tuple[AttemptUsage, ...] = ()
    #: the request's ``--max-cost`` ("" = none), here for every reader (the request is 0600)
    max_cost_usd: str = ""
    #: ranks of the running attempt whose step time stays well above the others',
    #: "rank <r> on <address>: <x> s/step, <k>x the median" (``hang_rules.stragglers``)
    stragglers: tuple[str, ...] = ()
    #: nodes lost while an elastic attempt trained on without them (each a NodeLoss)
    node_losses: tuple[NodeLoss, ...] = ()
    #: while the running attempt's ranks make no progress (with or without --hang-timeout):
    #: "no progress on any rank for <n> min" ("" while they do)
    stalled: str = ""


@record
class RankStack(Record):
    """One rank of a hung attempt (in ``attempts/<n>.hang.json``): where it was, its stack."""

    KIND: ClassVar[str] = "rank stack"
    rank: int
    address: str = ""
    pid: int = 0
    step: int | None = None  # its last declared step (None: it never reported)
    seconds_since_progress: float | None = None
    stack: str = ""  # py-spy's dump of its threads, innermost frame first
    signature: str = ""  # the main thread's functions, what ranks are compared on
    error: str = ""  # why there is no stack (py-spy failed, the process was gone)
    odd: bool = False  # not where the others are (a lower step, or another stack)


@record
class HangReport(Record):
    """``managed/<id>/attempts/<n>.hang.json``: attempt ``n`` made no progress on any rank
    for ``--hang-timeout`` seconds; every rank's stack as ``py-spy dump`` saw it, and the
    ranks (and their nodes) that were not where the others were."""

    KIND: ClassVar[str] = "hang report"
    attempt: int
    detected_at: float
    last_progress_at: float
    hang_timeout: float
    ranks: tuple[RankStack, ...] = ()
    odd_ranks: tuple[int, ...] = ()
    odd_addresses: tuple[str, ...] = ()
    reason: str = ""


@record
class ControllerHeartbeat(Record):
    """``cluster/controller.json``: the master's job controller is alive (every second)."""

    KIND: ClassVar[str] = "controller heartbeat"
    pid: int
    heartbeat: float
    seq: int = 0
    state: str = "running"  # running | stopped
    hostname: str = ""
    instance_id: str = ""
    address: str = ""
    started_at: float = 0.0
    job_id: str = ""
    #: when the controller marked instances Unhealthy in the last hour (its circuit breaker),
    #: for display: a successor counts from the signed ``cluster/breaker.json`` only
    replacements: tuple[float, ...] = ()


@record
class IdleStopRecord(Record):
    """``cluster/idle-stop.json``: the job controller's idle stop (``jobs.controller.idle``).
    Idle since ``idle_since`` (no managed job running or queued, no job share running on any
    node), the workers stop at ``stop_at``; once stopped (``stopped_at``), the worker group's
    size and minimum before the stop are what the next job scales it back to. The master's
own stop (``jobs.controller.idle_master``) is the ``master_*`` fields: a controller on
another instance than ``master_instance`` is the woken master and clears them."""

    KIND: ClassVar[str] = "idle stop"
    state: str  # disabled | busy | idle | stopping (recorded before the call) | stopped
    updated_at: float
    idle_seconds: float = 0.0  # the setting (idleStopMinutes x 60); 0: never stops
    idle_since: float | None = None
    stop_at: float | None = None
    stopped_at: float | None = None
    group: str = ""  # the worker Auto Scaling group
    desired_before: int = 0
    min_before: int = 0
    resumed_at: float | None = None
    message: str = ""  # the last stop's or resume's outcome (an AWS error, say)
    master_seconds: float = 0.0  # idleStopMasterMinutes x 60; 0: the master never stops
    master_stopped_at: float | None = None  # the master's release was requested then
    master_instance: str = ""  # by (and for) this master instance


@record
class BreakerMarks(Record):
    """``cluster/breaker.json``: when the job controller marked instances Unhealthy in the
    last hour (its circuit breaker), signed by the master and rewritten only when a mark is
    added: what a successor keeps counting from (``controller.json`` shows them, unsigned)."""

    KIND: ClassVar[str] = "breaker marks"
    marks: tuple[float, ...]
    updated_at: float
    controller: str = ""  # "<instance-id>/<pid>" of the controller that wrote it

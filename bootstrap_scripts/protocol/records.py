"""Typed records of the cluster protocol.

Every record is a frozen dataclass with the one (de)serialiser they share,
:class:`~bootstrap_scripts.protocol.record_base.Record` (strict JSON in, sorted JSON out; a
field that does not fit its annotation is a ``ProtocolError`` naming the file and the field;
unknown fields are ignored, so a newer writer does not break an older reader). ``Record`` and
``record`` are importable from here too.

The records here are the small ones (registrations, heartbeats, drains, job-share
acknowledgements, launch failures); the managed jobs' records are in
:mod:`bootstrap_scripts.protocol.managed_records`, and the membership and the job spec have
their own modules because they carry behaviour. Where each record lives on disk:
:mod:`bootstrap_scripts.protocol.paths`.
"""

from __future__ import annotations

from typing import ClassVar

from bootstrap_scripts.protocol.record_base import Record, record

# -- the node agents' records ------------------------------------------------------------------


@record
class Registration(Record):
    """``cluster/nodes/<instance-id>.json``: a node's agent says it is up (rewritten as its
    heartbeat). The master forms and grows the cluster from these."""

    KIND: ClassVar[str] = "node registration"
    instance_id: str
    address: str
    role: str
    gpus: int = 0
    instance_type: str = ""
    agent_pid: int = 0
    started_at: float = 0.0
    heartbeat: float = 0.0
    generation_applied: int = 0
    efs_mount: str = "/efs"
    cluster_id: str = ""


@record
class PrepResult(Record):
    """``cluster/prepared/<instance-id>.ok|.failed``: the outcome of the data-preparation
    command on a node; a node joins only with ``.ok``."""

    KIND: ClassVar[str] = "data-preparation result"
    instance_id: str
    address: str
    command: str
    started_at: float
    finished_at: float
    seconds: float
    exit_code: int | None = None
    error: str = ""
    output_tail: str = ""


@record
class DrainRecord(Record):
    """``cluster/drain/<instance-id>.json``: the master asks the node at ``address`` to stop
    its job shares; completed (``completed_at`` set) once the lifecycle action is done."""

    KIND: ClassVar[str] = "drain request"
    instance_id: str
    address: str
    requested_at: float
    deadline: float
    asg: str
    role: str
    lifecycle_hook: str
    lifecycle_action_token: str
    member: bool = False
    base: bool = False
    attempts: int = 0
    retry_at: float = 0.0
    completed_at: float | None = None
    reason: str = ""
    result: str = ""
    outcome: str = ""
    seconds: float = 0.0

    @property
    def completed(self) -> bool:
        return self.completed_at is not None


@record
class DrainDone(Record):
    """``cluster/drain/<instance-id>.done``: written by the node's job executor once none of
    its shares runs any more."""

    KIND: ClassVar[str] = "drain acknowledgement"
    instance_id: str
    address: str
    done_at: float
    requested_at: float = 0.0
    executor_pid: int = 0


@record
class ExecutorHeartbeat(Record):
    """``cluster/executors/<address>.json``: a node's job executor is alive (every second)."""

    KIND: ClassVar[str] = "executor heartbeat"
    address: str
    heartbeat: float
    seq: int = 0
    state: str = "running"
    hostname: str = ""
    pid: int = 0
    started_at: float = 0.0
    root: str = "/"
    efs_mount: str = "/efs"
    efs_mounted: bool = False
    efs_ok: bool = True
    gpus: int = 0
    generation: int = 0
    running: tuple[str, ...] = ()
    #: free MiB on the node's local disk (the filesystem of the executor's state); -1: not
    #: measured (an executor from before this field, or statvfs failed)
    disk_free_mib: int = -1


@record
class Listening(Record):
    """One TCP socket a job listens on: who may connect to it (its ``uid``, the job's)."""

    KIND: ClassVar[str] = "listening socket"
    host: str
    port: int
    uid: int


@record
class NodeListeners(Record):
    """``cluster/listeners/<address>.<seq>.json``: what the jobs on one node listen on at
    its address, as its root executor found it in its own kernel (written when it changes);
    every node's executor keeps every other user away from each (``listen_guard``)."""

    KIND: ClassVar[str] = "node listeners"
    address: str
    seq: int
    listening: tuple[Listening, ...] = ()


@record
class InstanceTypeFacts(Record):
    """``cluster/instance-types/<type>.json``: what EC2's DescribeInstanceTypes says about
    one instance type, cached by the health gate (a type's hardware never changes)."""

    KIND: ClassVar[str] = "instance type facts"
    instance_type: str
    gpus: int  # the sum of GpuInfo.Gpus[].Count; 0 for a type without GpuInfo
    gpu_name: str = ""
    efa_supported: bool = False
    fetched_at: float = 0.0



@record
class InstancePrice(Record):
    """``cluster/prices/<market>.<place>.<type>.json``: the hourly USD rate of an instance type
    bought one way (``ops/cost.Market``) in a region (On-Demand, a reservation, a Capacity
    Block: the Price List) or an Availability Zone (Spot: the Spot price history), as the job
    controller fetched it (``ops/prices``), so AWS is asked once per price, not per attempt."""

    KIND: ClassVar[str] = "instance price"
    market: str
    place: str  # the region, or for Spot the Availability Zone
    instance_type: str
    usd_per_hour: str  # exact decimal
    fetched_at: float
    source: str = ""  # the API and filters it came from

# -- a job's per-node records (under jobs/<job-id>/) ----------------------------------------------


@record
class ShareStarted(Record):
    """``jobs/<id>/nodes/<rank>.started``: the executor started its share of the job."""

    KIND: ClassVar[str] = "share start"
    rank: int
    address: str
    started_at: float
    pgid: int = 0
    pids: tuple[int, ...] = ()
    hostname: str = ""
    error: str = ""


@record
class ShareExit(Record):
    """``jobs/<id>/nodes/<rank>.exit``: how the share ended."""

    KIND: ClassVar[str] = "share exit"
    rank: int
    address: str
    returncode: int
    signal: int = 0
    cancelled: bool = False
    drained: bool = False
    reason: str = ""
    started_at: float | None = None
    finished_at: float = 0.0
    left_alive: int = 0
    #: Who ended the share when not the job's own processes: "" (the returncode is the
    #: job's), or :data:`FAULT_INFRASTRUCTURE` (the node's executor lost track of it, e.g.
    #: it restarted and could not collect the exit status): never a failure of the code.
    fault: str = ""


#: ``ShareExit.fault``: the share ended because of the node's machinery, not the job's code.
FAULT_INFRASTRUCTURE = "infrastructure"


@record
class RankProgress(Record):
    """``jobs/<id>/progress/<rank>.json``: one rank's latest declared progress, written by
    the training script itself (``bootstrap_scripts.progress.report``, atomically, at most
    about once a second). The job controller judges hangs and stragglers from it; a
    metrics emitter can read the same file. ``time`` is the writer's wall clock at the
    report; ``step_seconds`` the mean time per step since its previous report (or what the
    script measured itself); ``recent_step_seconds`` the last few of those, oldest first.
    ``recent_compute_seconds``: the last few of the rank's OWN times per step, oldest first,
    when the script measures them (its time less its wait for the others in the gradient
    all-reduce, which makes wall-clock step times equal on every rank): what tells a
    straggler from the ranks waiting for it; empty when the script does not."""

    KIND: ClassVar[str] = "rank progress"
    rank: int
    step: int
    time: float
    pid: int = 0
    host: str = ""
    local_rank: int = -1
    started_at: float = 0.0  # the first report of this process
    loss: float | None = None
    samples_per_s: float | None = None
    step_seconds: float | None = None
    recent_step_seconds: tuple[float, ...] = ()
    recent_compute_seconds: tuple[float, ...] = ()


@record
class ShareClaim(Record):
    """``jobs/<id>/nodes/<rank>.claim``: an elastic job's joining node took rank ``rank``
    (created with O_EXCL: several nodes may join at once, nobody hands out numbers)."""

    KIND: ClassVar[str] = "share claim"
    rank: int
    address: str
    generation: int
    claimed_at: float


@record
class RunnerHeartbeat(Record):
    """``jobs/<id>/runner.json``: the runner is still following the job (``seq`` moves
    every second; executors stop a job whose runner went silent)."""

    KIND: ClassVar[str] = "runner heartbeat"
    seq: int
    pid: int = 0
    time: float = 0.0


@record
class NodeResult(Record):
    """One node's line in ``result.json``."""

    KIND: ClassVar[str] = "node result"
    rank: int
    address: str
    returncode: int | None = None
    reason: str = ""
    left: bool = False
    joined: bool = False


@record
class JobResult(Record):
    """``jobs/<id>/result.json``: the job's outcome as the runner saw it."""

    KIND: ClassVar[str] = "job result"
    job_id: str
    status: str  # succeeded | failed | cancelled
    launcher: str = ""
    elastic: bool = False
    nodes: tuple[NodeResult, ...] = ()


# -- capacity: what failed to launch (docs/capacity-adjuster.md, "Launch diagnostics") --------


@record
class LaunchAttempt(Record):
    """One zone a group tried, as the capacity adjuster's ``asg-setup`` reported it."""

    KIND: ClassVar[str] = "launch attempt"
    role: str
    asg: str
    zone: str
    instance_types: tuple[str, ...] = ()
    cause: str = ""  # EC2's message (or "insufficient capacity" for a zone left earlier)
    decision: str = ""  # move | stale | "" (the group stayed)
    at: float = 0.0


@record
class LaunchFailures(Record):
    """``cluster/launch-failures.json``: every launch attempt that failed, oldest first."""

    KIND: ClassVar[str] = "launch failures"
    attempts: tuple[LaunchAttempt, ...] = ()

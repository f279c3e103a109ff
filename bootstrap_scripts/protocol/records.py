"""Typed records of the cluster protocol, and the one (de)serialiser they share.

Every record is a frozen dataclass. ``to_json`` writes sorted, indented JSON;
``from_json``/``from_dict`` check each field against its annotation and raise
:class:`~bootstrap_scripts.protocol.errors.ProtocolError` naming the file and the field. Unknown
fields are ignored, so a newer writer does not break an older reader.

The records here are the small ones (registrations, heartbeats, drains, job-share
acknowledgements, launch failures); the managed jobs' records are in
:mod:`bootstrap_scripts.protocol.managed_records`, and the membership and the job spec have
their own modules because they carry behaviour. Where each record lives on disk:
:mod:`bootstrap_scripts.protocol.paths`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from bootstrap_scripts.protocol.errors import ProtocolError

R = TypeVar("R", bound="Record")


def _convert(value: Any, hint: Any, *, source: str, field: str) -> Any:
    """``value`` (decoded JSON) as ``hint``, or ProtocolError."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, source=source, field=field)
            except ProtocolError:
                continue
        raise ProtocolError(f"expected {hint}, got {value!r}", source=source, field=field)
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        if isinstance(value, list | tuple):
            item = args[0] if args else Any
            return tuple(_convert(v, item, source=source, field=f"{field}[{i}]")
                         for i, v in enumerate(value))
    elif origin is dict:
        if isinstance(value, Mapping):
            key_t, val_t = args if args else (Any, Any)
            return {_convert(k, key_t, source=source, field=field):
                    _convert(v, val_t, source=source, field=f"{field}.{k}")
                    for k, v in value.items()}
    elif isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict(value, source=source, prefix=f"{field}.")
    else:  # pragma: no cover - a record declared a type this module does not know
        raise TypeError(f"unsupported field type {hint!r} for {field}")
    raise ProtocolError(f"expected {getattr(hint, '__name__', hint)}, got {value!r}",
                        source=source, field=field)


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class Record:
    """Mixin for protocol dataclasses: strict JSON in, sorted JSON out."""

    #: What the record is, for messages ("executor heartbeat", "drain request", ...).
    KIND: ClassVar[str] = "record"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls: type[R], data: Any, *, source: str = "", prefix: str = "") -> R:
        source = source or cls.KIND
        if not isinstance(data, Mapping):
            raise ProtocolError(f"a {cls.KIND} must be a JSON object, got {type(data).__name__}",
                                source=source, field=prefix.rstrip("."))
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            name = f"{prefix}{f.name}"
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ProtocolError("missing", source=source, field=name)
                continue
            kwargs[f.name] = _convert(data[f.name], hints[f.name], source=source, field=name)
        try:
            return cls(**kwargs)
        except ProtocolError:
            raise
        except (TypeError, ValueError) as exc:
            raise ProtocolError(str(exc), source=source) from exc

    @classmethod
    def from_json(cls: type[R], text: str, *, source: str = "") -> R:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ProtocolError(f"not valid JSON: {exc}", source=source or cls.KIND) from exc
        return cls.from_dict(data, source=source)


def record(cls: type[R]) -> type[R]:
    """Decorator: a frozen dataclass that is also a :class:`Record`."""
    return dataclasses.dataclass(frozen=True)(cls)


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

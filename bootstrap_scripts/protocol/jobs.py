"""The job spec (what ``dl-run`` asks every node's job executor to run) and the run request.

``jobs/<job-id>/spec.json`` is written last and atomically: its appearance is the go. The
other files of a job directory are listed in :class:`~bootstrap_scripts.protocol.paths.JobPaths`;
the small per-node records in :mod:`~bootstrap_scripts.protocol.records`.
Plain Python only: runs on nodes without torch.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import asdict, dataclass, field

from bootstrap_scripts.protocol import record_base
from bootstrap_scripts.protocol.bounds import MAX_GENERATION, MAX_TIME, real, whole
from bootstrap_scripts.protocol.data_source import (
    DataSourceError,
    check_mounts,
)
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.nnodes import NodeRangeError, parse_nnodes
from bootstrap_scripts.protocol.paths import validate_job_id

SPEC_SCHEMA = 1
#: In an elastic job's ``join_template``, replaced by the joining node's address.
ADDRESS_PLACEHOLDER = "{address}"
#: The rendezvous window: privileged ports (below 1024: only root may bind them, see
#: ip(7) ``ip_unprivileged_port_start``) that the root job executor binds on the master for a
#: torchrun job's store (:class:`Listener`). Below 512, where neither glibc's
#: ``bindresvport`` (512-1023) nor the kernel's NFS client (665-1023) take source ports, and
#: assigned to nothing a Deep Learning AMI runs (sshd 22, rpcbind 111, DNS 53 are far off).
RDZV_PORTS = range(294, 310)
#: The variable that tells a process the number of the listening descriptor it inherited.
LISTEN_FD_VARIABLE = "DL_LISTEN_FD"
#: A torchrun job's rendezvous port unless ``--rdzv-port`` says otherwise (the window's first).
DEFAULT_RDZV_PORT = RDZV_PORTS[0]
#: The first unprivileged port: root binding one grants the job nothing its user could
#: not bind alone, so these are allowed too (a development executor that is not root can
#: bind only these), without the window's guarantee that no user can take it first.
UNPRIVILEGED_PORTS = range(1024, 65536)


class JobSpecError(ProtocolError):
    """A job spec or job id is malformed; the message names the offending value (and, for a
    field of a spec, says it is the job spec's)."""

    def __init__(self, message: str, *, source: str = "", field: str = "") -> None:
        super().__init__(message, source=source or ("job spec" if field else ""), field=field)


@dataclass(frozen=True)
class Proc:
    """One process of a node's share. ``wait=False`` marks helpers (e.g. a TensorFlow
    parameter server) that never exit by themselves: the share is over when every
    ``wait=True`` process has exited, and the helpers are then stopped."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    label: str = ""
    wait: bool = True
    #: a listening socket the root executor binds before any process of the share starts
    #: and hands to this process (None: none)
    listen: Listener | None = None


@dataclass(frozen=True)
class Listener:
    """A TCP listening socket that the node's root job executor binds for a process of a
    share, before it starts any process of that share, and hands over as an inherited file
    descriptor (its number in ``DL_LISTEN_FD``): a torchrun job's rendezvous store, so that
    no other user's process can hold the job's rendezvous address (docs/security.md).

    The spec is the user's file: the fields are checked here (an address, a port of
    :data:`RDZV_PORTS` or an unprivileged one, never e.g. 22) and again by the executor,
    which binds only its own node's address when it is the membership's master."""

    host: str
    port: int

    def __post_init__(self) -> None:
        _address(self.host)
        if not listen_port_allowed(self.port):
            raise JobSpecError(f"invalid listening port {self.port!r}: the rendezvous window "
                               f"{RDZV_PORTS[0]}-{RDZV_PORTS[-1]} or "
                               f"{UNPRIVILEGED_PORTS[0]}-{UNPRIVILEGED_PORTS[-1]}",
                               field="listen.port")


def listen_port_allowed(port: object) -> bool:
    """Whether root may bind ``port`` for a job: the rendezvous window or unprivileged."""
    return type(port) is int and (port in RDZV_PORTS or port in UNPRIVILEGED_PORTS)


@dataclass(frozen=True)
class Share:
    """What one node runs for a job."""

    rank: int
    address: str
    procs: tuple[Proc, ...]


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    launcher: str
    shares: tuple[Share, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    created_at: float = 0.0
    grace_seconds: float = 5.0
    orphan_timeout: float = 30.0
    master_only: bool = False
    #: elastic jobs: nodes of a membership generation newer than ``generation`` join by
    #: starting ``join_template`` (its ``{address}`` replaced) under a rank they claim
    elastic: bool = False
    generation: int = 0
    join_template: Proc | None = None
    #: elastic jobs of the job controller: a joining node also waits for
    #: ``admitted/<address>`` (the controller's health gate passed) before it joins
    join_admission: bool = False
    #: ``s3://bucket/prefix:/dir`` each: the node's root executor mounts them read-only for
    #: the job's user before it starts the share, and unmounts them when it ends
    #: (``jobs/executor/s3_mounts.py``)
    mounts: tuple[str, ...] = ()
    #: torchrun's ``--nnodes`` as the launcher computed it ("": another launcher, older spec)
    nnodes: str = ""
    schema: int = SPEC_SCHEMA

    def share_for(self, address: str) -> Share | None:
        return next((s for s in self.shares if s.address == address), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """The spec in ``text``, every field checked for its type (a user writes this file
        and root reads it: a wrong type is a :class:`JobSpecError`, never another
        exception)."""
        try:
            data = _object(record_base.loads(text, source="job spec"), "")
            if data.get("schema", SPEC_SCHEMA) != SPEC_SCHEMA:
                raise JobSpecError(f"unsupported job spec schema {data.get('schema')!r}")
            shares = tuple(
                Share(
                    rank=_rank(_object(s, "shares").get("rank")),
                    address=_address(_text(s.get("address"), "address")),
                    procs=tuple(_proc(p) for p in _array(s.get("procs"), "procs")),
                )
                for s in _array(data.get("shares"), "shares")
            )
            template = data.get("join_template")
            spec = cls(
                job_id=checked_job_id(_text(data.get("job_id"), "job_id")),
                launcher=_text(data.get("launcher"), "launcher"),
                shares=shares,
                env=_env(data.get("env", {}), "env"),
                cwd=_text(data.get("cwd", ""), "cwd"),
                created_at=_number(data.get("created_at", 0.0), "created_at"),
                grace_seconds=_number(data.get("grace_seconds", 5.0), "grace_seconds"),
                orphan_timeout=_number(data.get("orphan_timeout", 30.0), "orphan_timeout"),
                master_only=_flag(data.get("master_only", False), "master_only"),
                elastic=_flag(data.get("elastic", False), "elastic"),
                generation=_whole(data.get("generation", 0), "generation"),
                join_template=_proc(template) if template else None,
                join_admission=_flag(data.get("join_admission", False), "join_admission"),
                mounts=tuple(_text(m, "mounts") for m in _array(data.get("mounts", []),
                                                                  "mounts")),
                nnodes=_text(data.get("nnodes", ""), "nnodes"),
            )
            check_mounts(spec.mounts)
            if spec.nnodes:
                parse_nnodes(spec.nnodes)
        except DataSourceError as exc:
            raise JobSpecError(str(exc), field="mounts") from None
        except NodeRangeError as exc:
            raise JobSpecError(str(exc), field="nnodes") from None
        except JobSpecError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise JobSpecError(f"malformed job spec: {exc!r}") from exc
        for share in spec.shares:
            if not share.procs or any(not p.argv for p in share.procs):
                raise JobSpecError(f"share of node {share.address} has an empty command")
            _check_listeners(share)
        if spec.join_template is not None and spec.join_template.listen is not None:
            raise JobSpecError("an elastic job's join template cannot ask for a listener",
                               field="listen")
        return spec


def _check_listeners(share: Share) -> None:
    """Root binds a listener only for the job's master (the share of rank 0, at most one)
    and only on that share's own address: a spec cannot have root bind a port elsewhere."""
    listeners = [p.listen for p in share.procs if p.listen is not None]
    if not listeners:
        return
    if share.rank != 0 or len(listeners) > 1 or listeners[0].host != share.address:
        raise JobSpecError(f"share of node rank {share.rank} ({share.address}) asks for "
                           f"listeners on {', '.join(f'{x.host}:{x.port}' for x in listeners)}"
                           f": only the share of rank 0, one, on its own address",
                           field="listen")


def _proc(p: object) -> Proc:
    p = _object(p, "procs")
    listen = p.get("listen")
    if listen:
        listen = _object(listen, "listen")
    return Proc(
        argv=tuple(_text(a, "argv") for a in _array(p.get("argv"), "argv")),
        env=_env(p.get("env", {}), "procs.env"),
        label=_label(_text(p.get("label", ""), "label")),
        wait=_flag(p.get("wait", True), "wait"),
        listen=Listener(host=_text(listen.get("host"), "listen.host"),
                        port=listen.get("port")) if listen else None,
    )


# -- the shape of a spec's values: a wrong type is a JobSpecError naming the field --------
#: A variable's name as a process environment can carry it: no '=' (it ends the name) and
#: no NUL (it ends the string); ``execve`` and Python's ``subprocess`` refuse either.
ENV_NAME_RE = re.compile(r"[^=\x00]{1,1024}")


def _object(value: object, name: str) -> dict:
    if not isinstance(value, dict):
        raise JobSpecError(f"expected a JSON object, got {type(value).__name__}", field=name)
    return value


def _array(value: object, name: str) -> list:
    if not isinstance(value, list):
        raise JobSpecError(f"expected a JSON array, got {type(value).__name__}", field=name)
    return value


def _text(value: object, name: str) -> str:
    """A string a process may be given (argv, a path, a value): no NUL in it."""
    if not isinstance(value, str) or "\x00" in value:
        raise JobSpecError(f"expected a string without NUL, got {type(value).__name__}",
                           field=name)
    return value


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise JobSpecError(f"expected true or false, got {type(value).__name__}", field=name)
    return value


def _number(value: object, name: str) -> float:
    try:
        return real(value, field=name, low=-MAX_TIME, high=MAX_TIME)
    except ProtocolError as exc:
        raise JobSpecError(str(exc), field=name) from None


def _whole(value: object, name: str) -> int:
    try:
        return whole(value, field=name, low=0, high=MAX_GENERATION)
    except ProtocolError as exc:
        raise JobSpecError(str(exc), field=name) from None


def _env(value: object, name: str) -> dict[str, str]:
    """A process environment: names a process can carry (:data:`ENV_NAME_RE`), string
    values without NUL."""
    env = _object(value, name)
    for key, val in env.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise JobSpecError(f"invalid variable name {key[:60]!r}: no '=' and no NUL",
                               field=name)
        _text(val, f"{name}.{key[:60]}")
    return dict(env)


#: A process label names a log file (``nodes/<rank>-<label>.log``) the root executor
#: opens: a word, never a path (no '/', no '..').
LABEL_RE = re.compile(r"|[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
#: A node address names its executor's heartbeat file: an IP address or a host name.
ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")
#: Share ranks (elastic joins claim ranks past the spec's).
MAX_RANK = 1_000_000


def _label(label: str) -> str:
    if not LABEL_RE.fullmatch(label):
        raise JobSpecError(f"invalid process label {label!r}: letters, digits, '_' or '-' "
                           "(max 32), starting with a letter or digit", field="label")
    return label


def _address(address: str) -> str:
    if not ADDRESS_RE.fullmatch(address) or ".." in address:
        raise JobSpecError(f"invalid node address {address!r}", field="address")
    return address


def _rank(rank: object) -> int:
    try:
        return whole(rank, field="rank", low=0, high=MAX_RANK)
    except ProtocolError as exc:
        raise JobSpecError(str(exc), field="rank") from None


def new_job_id(name: str = "job") -> str:
    """Sortable by time, unique without coordination (random suffix), readable."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "job"
    return validate_job_id(f"{clean[:60]}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}")


def checked_job_id(job_id: str) -> str:
    """``job_id`` if it is a valid job id, else a :class:`JobSpecError` naming it."""
    try:
        return validate_job_id(job_id)
    except ProtocolError as exc:
        raise JobSpecError(str(exc), field="job_id") from None


def join_share(template: Proc, rank: int, address: str) -> Share:
    """An elastic job's share for a node that joins later: the spec's ``join_template``
    with ``{address}`` replaced by the node's address."""
    argv = tuple(a.replace(ADDRESS_PLACEHOLDER, address) for a in template.argv)
    return Share(rank, address, (Proc(argv=argv, env=dict(template.env), label=template.label),))


#: The reason a job executor writes in the exit of a share it found running when it
#: restarted (and stopped): the product's own fault, classified ``infrastructure``.
EXECUTOR_RESTARTED_REASON = "the job executor restarted"
#: How a job's cancel file begins when its user cancelled it (``dl-jobs cancel``, passed on
#: by the job controller to the running attempt): the runner then records the job as
#: ``cancelled``, not failed. Any other text in it (a hang, the cost cap, a controller
#: stopping, an orphaned attempt) is the product stopping the job: its cause is its own.
USER_CANCEL_REASON = "cancelled by the user"

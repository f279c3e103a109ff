"""The job spec: what ``dl-run`` asks every node's job executor to run.

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

from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.paths import validate_job_id

SPEC_SCHEMA = 1
#: In an elastic job's ``join_template``, replaced by the joining node's address.
ADDRESS_PLACEHOLDER = "{address}"


class JobSpecError(ProtocolError):
    """A job spec or job id is malformed; the message names the offending value."""


@dataclass(frozen=True)
class Proc:
    """One process of a node's share. ``wait=False`` marks helpers (e.g. a TensorFlow
    parameter server) that never exit by themselves: the share is over when every
    ``wait=True`` process has exited, and the helpers are then stopped."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    label: str = ""
    wait: bool = True


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
    schema: int = SPEC_SCHEMA

    def share_for(self, address: str) -> Share | None:
        return next((s for s in self.shares if s.address == address), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        try:
            data = json.loads(text)
            if int(data.get("schema", SPEC_SCHEMA)) != SPEC_SCHEMA:
                raise JobSpecError(f"unsupported job spec schema {data.get('schema')!r}")
            shares = tuple(
                Share(
                    rank=int(s["rank"]),
                    address=str(s["address"]),
                    procs=tuple(_proc(p) for p in s["procs"]),
                )
                for s in data["shares"]
            )
            template = data.get("join_template")
            spec = cls(
                job_id=_job_id(str(data["job_id"])),
                launcher=str(data["launcher"]),
                shares=shares,
                env={str(k): str(v) for k, v in data.get("env", {}).items()},
                cwd=str(data.get("cwd", "")),
                created_at=float(data.get("created_at", 0.0)),
                grace_seconds=float(data.get("grace_seconds", 5.0)),
                orphan_timeout=float(data.get("orphan_timeout", 30.0)),
                master_only=bool(data.get("master_only", False)),
                elastic=bool(data.get("elastic", False)),
                generation=int(data.get("generation", 0)),
                join_template=_proc(template) if template else None,
            )
        except JobSpecError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise JobSpecError(f"malformed job spec: {exc!r}") from exc
        for share in spec.shares:
            if not share.procs or any(not p.argv for p in share.procs):
                raise JobSpecError(f"share of node {share.address} has an empty command")
        return spec


def _proc(p: dict) -> Proc:
    return Proc(
        argv=tuple(str(a) for a in p["argv"]),
        env={str(k): str(v) for k, v in p.get("env", {}).items()},
        label=str(p.get("label", "")),
        wait=bool(p.get("wait", True)),
    )


def new_job_id(name: str = "job") -> str:
    """Sortable by time, unique without coordination (random suffix), readable."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "job"
    return validate_job_id(f"{clean[:60]}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}")


def _job_id(job_id: str) -> str:
    try:
        return validate_job_id(job_id)
    except ProtocolError as exc:
        raise JobSpecError(str(exc), field="job_id") from None


def join_share(template: Proc, rank: int, address: str) -> Share:
    """An elastic job's share for a node that joins later: the spec's ``join_template``
    with ``{address}`` replaced by the node's address."""
    argv = tuple(a.replace(ADDRESS_PLACEHOLDER, address) for a in template.argv)
    return Share(rank, address, (Proc(argv=argv, env=dict(template.env), label=template.label),))


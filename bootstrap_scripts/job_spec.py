"""The job contract between ``dl-run`` and the per-node job executors (files on EFS).

Everything the runner and the executors say to each other is a file under
``<EFS>/jobs/<job-id>/``, because EFS is the one thing every node already shares and it
gives close-to-open consistency: a file renamed into place is seen whole or not at all.
That needs no SSH keys, no open ports and no broker, and it leaves a record of every job.

Layout of one job directory::

    spec.json            what to run on which node (written last, atomically: it is the go)
    commands.txt         the resolved per-node commands, for humans
    runner.json          the runner's heartbeat (a counter; executors watch it change)
    cancel               marker: stop every share now (runner got Ctrl-C/SIGTERM, or failed)
    done                 marker: the runner has finished with the job
    result.json          per-node exit codes, as the runner saw them
    nodes/<rank>.log     output of the node's share (``<rank>-<label>.log`` if several procs)
    nodes/<rank>.started executor's acknowledgement: pids, process group, start time
    nodes/<rank>.exit    the share's exit: {"returncode": N, "drained": false, ...}
    nodes/<rank>.claim   elastic jobs: a joining node's executor claims rank N (O_EXCL)

Executors heartbeat to ``<EFS>/cluster/executors/<address>.json``. Elastic membership
(protocol §7): ``<EFS>/cluster/drain/<instance-id>.json`` asks the node at its ``address``
to leave; its executor stops its shares and writes ``<instance-id>.done``.
Plain Python only: runs on nodes without torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bootstrap_scripts.membership import EFS_CLUSTER_DIR, EFS_JOBS_DIR

SPEC_SCHEMA = 1
EXECUTORS_DIR = f"{EFS_CLUSTER_DIR}/executors"
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class JobSpecError(ValueError):
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
                job_id=validate_job_id(str(data["job_id"])),
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


def validate_job_id(job_id: str) -> str:
    """Job ids become directory names on EFS: no slashes, no dot-files, bounded length."""
    if not JOB_ID_RE.match(job_id):
        raise JobSpecError(
            f"invalid job id {job_id!r}: use letters, digits, '.', '_' or '-' (max 128), "
            "starting with a letter or digit"
        )
    return job_id


def new_job_id(name: str = "job") -> str:
    """Sortable by time, unique without coordination (random suffix), readable."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "job"
    return validate_job_id(f"{clean[:60]}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}")


# -- paths ---------------------------------------------------------------------------------


def jobs_dir(efs: str | os.PathLike) -> Path:
    return Path(efs) / EFS_JOBS_DIR


def job_dir(efs: str | os.PathLike, job_id: str) -> Path:
    return jobs_dir(efs) / validate_job_id(job_id)


def nodes_dir(jdir: Path) -> Path:
    return jdir / "nodes"


def log_name(rank: int, label: str = "") -> str:
    return f"{rank}-{label}.log" if label else f"{rank}.log"


def exit_path(jdir: Path, rank: int) -> Path:
    return nodes_dir(jdir) / f"{rank}.exit"


def started_path(jdir: Path, rank: int) -> Path:
    return nodes_dir(jdir) / f"{rank}.started"


def claim_path(jdir: Path, rank: int) -> Path:
    return nodes_dir(jdir) / f"{rank}.claim"


DRAIN_DIR = f"{EFS_CLUSTER_DIR}/drain"


def drain_dir(efs: str | os.PathLike) -> Path:
    return Path(efs) / DRAIN_DIR


def drain_done_path(efs: str | os.PathLike, instance_id: str) -> Path:
    return drain_dir(efs) / f"{instance_id}.done"


def executor_heartbeat_path(efs: str | os.PathLike, address: str) -> Path:
    return Path(efs) / EXECUTORS_DIR / f"{address}.json"


# -- small file helpers --------------------------------------------------------------------


def write_json_atomic(path: Path, data: object) -> None:
    """Temp file + rename in the same directory: readers on other nodes never see half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o644)  # runner and executors may run as different users
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict | None:
    """The JSON object at ``path``, or None if it is missing or (mid-replace) unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

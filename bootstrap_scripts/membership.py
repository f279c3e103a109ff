"""Cluster membership: the one data structure every node, the runner and EMR agree on.

The master agent builds a :class:`Membership`, publishes it on the shared file system, and
every node renders the SAME files from it with the functions below. Keeping the renderers
here (and nowhere else) is what makes the workers file, hostfiles and ``DEEPLEARNING_*``
environment byte-identical across nodes, EC2 and EMR alike.

Plain Python only: this module runs on nodes (no CDK, no boto3 imports).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1

#: Where node files live, relative to the node's root prefix ("/" on a real node).
DEEPLEARNING_DIR = "opt/deeplearning"
WORKERS_FILE = f"{DEEPLEARNING_DIR}/workers"
MPI_HOSTFILE = f"{DEEPLEARNING_DIR}/hostfile"
HOROVOD_HOSTS_FILE = f"{DEEPLEARNING_DIR}/horovod_hosts"
MEMBERSHIP_FILE = f"{DEEPLEARNING_DIR}/membership.json"
ENV_FILE = f"{DEEPLEARNING_DIR}/env"
PROFILE_FILE = "etc/profile.d/deeplearning.sh"
HOSTS_FILE = "etc/hosts"

#: Layout on the shared file system (relative to the EFS mount point).
EFS_CLUSTER_DIR = "cluster"
EFS_MEMBERSHIP = f"{EFS_CLUSTER_DIR}/membership.json"
EFS_GENERATIONS_DIR = f"{EFS_CLUSTER_DIR}/generations"
EFS_NODES_DIR = f"{EFS_CLUSTER_DIR}/nodes"
EFS_LOGS_DIR = f"{EFS_CLUSTER_DIR}/logs"
EFS_MEMBERSHIP_LOG = f"{EFS_CLUSTER_DIR}/membership.log"
EFS_JOBS_DIR = "jobs"

MASTER_ALIAS = "deeplearning-master"
ALIAS_PREFIX = "deeplearning-worker"
HOSTS_BEGIN = "# BEGIN deeplearning cluster (managed by the node agent; do not edit)"
HOSTS_END = "# END deeplearning cluster"


class MembershipError(ValueError):
    """A membership document is malformed; the message names the offending field/value."""


@dataclass(frozen=True)
class Node:
    """One cluster node as every other node sees it."""

    rank: int
    role: str  # "master" | "worker"
    instance_id: str
    address: str
    alias: str
    gpus: int = 0
    instance_type: str = ""
    #: Base nodes (the master and the first ``workerCount`` workers) are protected from
    #: scale-in; elastic ones come and go (docs/elastic.md). Old documents: every node base.
    base: bool = True

    @property
    def slots(self) -> int:
        """Processes this node runs: one per GPU, or one on a CPU-only node."""
        return max(1, self.gpus)


@dataclass(frozen=True)
class Membership:
    """A versioned view of the cluster. A higher ``generation`` always wins."""

    cluster_id: str
    generation: int
    nodes: tuple[Node, ...]
    efs_mount: str = "/efs"
    created_at: str = ""
    reason: str = "initial"
    schema: int = field(default=SCHEMA_VERSION)

    @property
    def master(self) -> Node:
        return self.nodes[0]

    @property
    def master_addr(self) -> str:
        return self.master.address

    def node_by_address(self, address: str) -> Node | None:
        return next((n for n in self.nodes if n.address == address), None)

    def node_by_instance(self, instance_id: str) -> Node | None:
        return next((n for n in self.nodes if n.instance_id == instance_id), None)

    def same_nodes(self, other: Membership | None) -> bool:
        """True when ``other`` lists the same nodes in the same order (generation aside)."""
        return other is not None and other.nodes == self.nodes

    # -- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict:
        data = asdict(self)
        data["nodes"] = [asdict(n) for n in self.nodes]
        data["master_addr"] = self.master_addr
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping) -> Membership:
        if not isinstance(data, Mapping):
            raise MembershipError(f"membership must be a JSON object, got {type(data).__name__}")
        try:
            schema = int(data.get("schema", SCHEMA_VERSION))
            if schema != SCHEMA_VERSION:
                raise MembershipError(f"unsupported membership schema {schema!r}")
            generation = int(data["generation"])
            raw_nodes = data["nodes"]
            if not isinstance(raw_nodes, list) or not raw_nodes:
                raise MembershipError(f"membership 'nodes' must be a non-empty list: {raw_nodes!r}")
            nodes = tuple(
                Node(
                    rank=int(n["rank"]),
                    role=str(n["role"]),
                    instance_id=str(n["instance_id"]),
                    address=str(ipaddress.ip_address(n["address"])),
                    alias=str(n["alias"]),
                    gpus=int(n.get("gpus", 0)),
                    instance_type=str(n.get("instance_type", "")),
                    base=bool(n.get("base", True)),
                )
                for n in raw_nodes
            )
        except MembershipError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise MembershipError(f"malformed membership document: {exc!r}") from exc
        membership = cls(
            cluster_id=str(data.get("cluster_id", "")),
            generation=generation,
            nodes=nodes,
            efs_mount=str(data.get("efs_mount", "/efs")),
            created_at=str(data.get("created_at", "")),
            reason=str(data.get("reason", "")),
            schema=schema,
        )
        validate(membership)
        return membership

    @classmethod
    def from_json(cls, text: str) -> Membership:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise MembershipError(f"membership is not valid JSON: {exc}") from exc

    @classmethod
    def load(cls, path: str | os.PathLike) -> Membership:
        return cls.from_json(Path(path).read_text())


def validate(m: Membership) -> None:
    """Reject documents that would make nodes disagree (duplicate addresses, bad ranks)."""
    if m.generation < 1:
        raise MembershipError(f"generation must be >= 1, got {m.generation}")
    if m.nodes[0].role != "master":
        raise MembershipError(f"first node must be the master, got role {m.nodes[0].role!r}")
    seen: set[str] = set()
    for expected_rank, node in enumerate(m.nodes):
        if node.rank != expected_rank:
            raise MembershipError(
                f"node {node.address} has rank {node.rank}, expected {expected_rank}"
            )
        if node.role not in ("master", "worker"):
            raise MembershipError(f"node {node.address} has unknown role {node.role!r}")
        if node.address in seen:
            raise MembershipError(f"duplicate node address {node.address}")
        if node.gpus < 0:
            raise MembershipError(f"node {node.address} has negative GPU count {node.gpus}")
        seen.add(node.address)


def _address_key(address: str) -> tuple[int, int]:
    ip = ipaddress.ip_address(address)
    return (ip.version, int(ip))


def build_membership(
    *,
    cluster_id: str,
    generation: int,
    master: Mapping,
    workers: Iterable[Mapping],
    efs_mount: str = "/efs",
    created_at: str = "",
    reason: str = "initial",
) -> Membership:
    """Order the nodes the way every consumer expects: master first, then workers.

    Workers are sorted numerically by IP address (the original sorted them as strings,
    which put 10.0.0.10 before 10.0.0.9). Each mapping needs ``instance_id``, ``address``
    and may carry ``gpus``, ``instance_type`` and ``base`` (default True; the master is
    always base). The master's own instance is dropped from
    ``workers`` if it appears there.
    """
    others = [w for w in workers if w["instance_id"] != master["instance_id"]]
    others.sort(key=lambda w: (_address_key(w["address"]), w["instance_id"]))
    ordered = [("master", master), *(("worker", w) for w in others)]
    nodes = tuple(
        Node(
            rank=rank,
            role=role,
            instance_id=str(item["instance_id"]),
            address=str(ipaddress.ip_address(item["address"])),
            alias=f"{ALIAS_PREFIX}{rank}",
            gpus=int(item.get("gpus", 0)),
            instance_type=str(item.get("instance_type", "")),
            base=True if role == "master" else bool(item.get("base", True)),
        )
        for rank, (role, item) in enumerate(ordered)
    )
    m = Membership(
        cluster_id=cluster_id,
        generation=generation,
        nodes=nodes,
        efs_mount=efs_mount,
        created_at=created_at,
        reason=reason,
    )
    validate(m)
    return m


# -- renderers: identical output on every node --------------------------------------------


def render_workers_file(m: Membership) -> str:
    """One host per line, master first (as the original). Addresses, so it resolves anywhere."""
    return "".join(f"{n.address}\n" for n in m.nodes)


def render_mpi_hostfile(m: Membership) -> str:
    """Open MPI / DeepSpeed hostfile: ``host slots=N``."""
    return "".join(f"{n.address} slots={n.slots}\n" for n in m.nodes)


def render_horovod_hosts(m: Membership) -> str:
    """Horovod discovery format: ``host:slots`` per line (join with ',' for ``-H``)."""
    return "".join(f"{n.address}:{n.slots}\n" for n in m.nodes)


def render_hosts_block(m: Membership) -> str:
    """The managed block for /etc/hosts: ``deeplearning-worker<N>`` aliases (+ master)."""
    lines = [HOSTS_BEGIN]
    for n in m.nodes:
        names = [n.alias] + ([MASTER_ALIAS] if n.role == "master" else [])
        lines.append(f"{n.address} {' '.join(names)}")
    lines.append(HOSTS_END)
    return "\n".join(lines) + "\n"


def merge_hosts_file(existing: str, m: Membership) -> str:
    """Replace (or append) the managed block; lines outside it are kept untouched."""
    out: list[str] = []
    skipping = False
    for line in existing.splitlines(keepends=True):
        stripped = line.rstrip("\n")
        if stripped == HOSTS_BEGIN:
            skipping = True
            continue
        if skipping:
            if stripped == HOSTS_END:
                skipping = False
            continue
        out.append(line)
    body = "".join(out)
    if body and not body.endswith("\n"):
        body += "\n"
    return body + render_hosts_block(m)


def node_environment(m: Membership, node: Node, *, root: str | os.PathLike = "/") -> dict[str, str]:
    """The variables a training job sees on ``node``. Paths include the node's root prefix."""
    r = Path(root)
    return {
        "DEEPLEARNING_WORKERS_PATH": str(r / WORKERS_FILE),
        "DEEPLEARNING_WORKERS_COUNT": str(len(m.nodes)),
        "DEEPLEARNING_WORKER_GPU_COUNT": str(node.gpus),
        "EFS_MOUNT": m.efs_mount,
        "DEEPLEARNING_MASTER_ADDR": m.master_addr,
        "DEEPLEARNING_NODE_RANK": str(node.rank),
        "DEEPLEARNING_NODE_ADDR": node.address,
        "DEEPLEARNING_HOSTFILE": str(r / MPI_HOSTFILE),
        "DEEPLEARNING_MEMBERSHIP_PATH": str(r / MEMBERSHIP_FILE),
        "DEEPLEARNING_GENERATION": str(m.generation),
    }


def render_profile(env: Mapping[str, str]) -> str:
    """/etc/profile.d/deeplearning.sh: written whole each time (the original appended)."""
    lines = ["# Deep-learning cluster environment (managed by the node agent; do not edit)"]
    lines += [f"export {k}={_sh_quote(v)}" for k, v in sorted(env.items())]
    return "\n".join(lines) + "\n"


def render_env_file(env: Mapping[str, str]) -> str:
    """KEY=VALUE lines for systemd ``EnvironmentFile=`` and the runner."""
    return "".join(f"{k}={v}\n" for k, v in sorted(env.items()))


def parse_env_file(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key.strip()] = value
    return env


def _sh_quote(value: str) -> str:
    if value and all(c.isalnum() or c in "/._-:,@+" for c in value):
        return value
    return "'" + value.replace("'", "'\"'\"'") + "'"


def render_node_files(
    m: Membership, node: Node, *, root: str | os.PathLike = "/", existing_hosts: str = ""
) -> dict[str, str]:
    """Every file a node writes for ``m``, keyed by path relative to the node's root."""
    env = node_environment(m, node, root=root)
    return {
        WORKERS_FILE: render_workers_file(m),
        MPI_HOSTFILE: render_mpi_hostfile(m),
        HOROVOD_HOSTS_FILE: render_horovod_hosts(m),
        MEMBERSHIP_FILE: m.to_json(),
        ENV_FILE: render_env_file(env),
        PROFILE_FILE: render_profile(env),
        HOSTS_FILE: merge_hosts_file(existing_hosts, m),
    }


def atomic_write(
    path: str | os.PathLike, content: str, *, mode: int = 0o644, fsync: bool = True
) -> bool:
    """Write ``content`` via temp file + rename. Returns False (and writes nothing) if the
    file already holds exactly ``content``, which is what makes re-applying idempotent.

    ``fsync=False`` skips the flush to disk for files that are re-verified anyway (the node
    agent rewrites any node file whose content differs every time it starts)."""
    p = Path(path)
    with contextlib.suppress(FileNotFoundError):
        if p.read_text() == content:
            return False
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(content)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True

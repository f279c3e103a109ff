"""What every node writes for a membership: workers file, hostfiles, /etc/hosts block and
the ``DEEPLEARNING_*`` environment. Rendering here, and nowhere else, is what makes these
files byte-identical across nodes, EC2 and EMR alike; change a format here.

Plain Python only: runs on nodes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from bootstrap_scripts.protocol.membership import MASTER_ALIAS, Membership, Node
from bootstrap_scripts.protocol.paths import (
    ENV_FILE,
    HOROVOD_HOSTS_FILE,
    HOSTS_FILE,
    MEMBERSHIP_FILE,
    MPI_HOSTFILE,
    PROFILE_FILE,
    WORKERS_FILE,
)

HOSTS_BEGIN = "# BEGIN deeplearning cluster (managed by the node agent; do not edit)"
HOSTS_END = "# END deeplearning cluster"

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
    """The managed block for /etc/hosts: every node as ``deeplearning-worker<rank + 1>``
    (``deeplearning-worker1`` .. ``deeplearning-worker<DEEPLEARNING_WORKERS_COUNT>``, the
    master first) and the master also as ``deeplearning-master``, as the original wrote them."""
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

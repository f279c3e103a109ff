"""The cluster protocol's paths on a node, relative to its root ("/" on a real node, a
directory per node in the local emulator): what ``protocol.paths`` lists "on a node".

Kept apart from ``paths`` (EFS's side) so each reads in one sitting; ``paths`` re-exports
every name here, and the rest of the project asks there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.protocol.job_paths import split_key

DEEPLEARNING_DIR = "opt/deeplearning"
WORKERS_FILE = f"{DEEPLEARNING_DIR}/workers"
MPI_HOSTFILE = f"{DEEPLEARNING_DIR}/hostfile"
HOROVOD_HOSTS_FILE = f"{DEEPLEARNING_DIR}/horovod_hosts"
MEMBERSHIP_FILE = f"{DEEPLEARNING_DIR}/membership.json"
ENV_FILE = f"{DEEPLEARNING_DIR}/env"
PROFILE_FILE = "etc/profile.d/deeplearning.sh"
HOSTS_FILE = "etc/hosts"
AGENT_STATE_DIR = "var/lib/dl-agent"
AGENT_STATE_FILE = f"{AGENT_STATE_DIR}/state.json"
#: A worker: the drain request for this node that its agent checked was the master's
#: (signed); the node's job executor acts on this copy, never on EFS's.
APPLIED_DRAIN_FILE = f"{AGENT_STATE_DIR}/drain.json"
#: This node's signing key, and (the master) every node's public key: protocol.node_signature.
NODE_KEY_FILE, NODE_KEYS_DIR = f"{AGENT_STATE_DIR}/node-key.pem", f"{AGENT_STATE_DIR}/node-keys"
EXECUTOR_STATE_DIR = "var/lib/dl-executor"
SHARE_STATUS_DIR = f"{EXECUTOR_STATE_DIR}/shares"


@dataclass(frozen=True)
class NodePaths:
    """A node's own files, under its root prefix."""

    root: Path

    def __init__(self, root: str | os.PathLike = "/") -> None:
        object.__setattr__(self, "root", Path(root))

    @classmethod
    def of_membership_file(cls, path: str | os.PathLike) -> NodePaths:
        """The node whose applied membership is ``path`` (``DEEPLEARNING_MEMBERSHIP_PATH`` in a
        job's environment): how a process the executor started finds its node's root."""
        p = Path(path)
        depth = len(Path(MEMBERSHIP_FILE).parts)
        if tuple(p.parts[-depth:]) != Path(MEMBERSHIP_FILE).parts:
            raise ValueError(f"{path} is not a node's {MEMBERSHIP_FILE}")
        return cls(p.parents[depth - 1])

    @property
    def deeplearning_dir(self) -> Path:
        return self.root / DEEPLEARNING_DIR

    @property
    def workers(self) -> Path:
        return self.root / WORKERS_FILE

    @property
    def hostfile(self) -> Path:
        return self.root / MPI_HOSTFILE

    @property
    def horovod_hosts(self) -> Path:
        return self.root / HOROVOD_HOSTS_FILE

    @property
    def membership(self) -> Path:
        return self.root / MEMBERSHIP_FILE

    @property
    def env(self) -> Path:
        return self.root / ENV_FILE

    @property
    def profile(self) -> Path:
        return self.root / PROFILE_FILE

    @property
    def hosts(self) -> Path:
        return self.root / HOSTS_FILE

    @property
    def agent_state(self) -> Path:
        return self.root / AGENT_STATE_FILE

    @property
    def applied_drain(self) -> Path:
        """This node's drain request as its agent accepted it (the executor drains on it)."""
        return self.root / APPLIED_DRAIN_FILE

    @property
    def node_key(self) -> Path:
        return self.root / NODE_KEY_FILE

    @property
    def node_keys_dir(self) -> Path:
        return self.root / NODE_KEYS_DIR

    def lock(self, name: str) -> Path:
        """The lock file the one running ``name`` daemon holds (:mod:`bootstrap_scripts.
        single_instance`): ``dl-agent``, ``dl-executor``, ``dl-controller``."""
        return self.root / AGENT_STATE_DIR / f"{name}.lock"

    @property
    def executor_lock(self) -> Path:
        return self.lock("dl-executor")

    @property
    def executor_state_dir(self) -> Path:
        """The executor's node-local state (share status files, job credentials): on the
        node's own disk, which the health gate's ``disk`` check measures."""
        return self.root / EXECUTOR_STATE_DIR

    @property
    def share_status_dir(self) -> Path:
        return self.root / SHARE_STATUS_DIR

    @property
    def job_credentials_dir(self) -> Path:
        """Where the executor keeps running jobs' job role credentials (node-local)."""
        return self.root / EXECUTOR_STATE_DIR / "job-credentials"

    def share_status(self, key: str, rank: int, index: int) -> Path:
        """How process ``index`` of this node's share ``rank`` of the job ``key`` ended."""
        user, job_id = split_key(key)
        return self.share_status_dir / f"{user}.{job_id}.{int(rank)}.{int(index)}.status"

"""Slurm's and munge's files on a node (under its root: "/" on EC2, a directory per node in
the local emulator) and Slurm's controller state on EFS: every path the ``scheduler=slurm``
nodes use, spelled once. ``protocol.paths`` re-exports every name here.

Everything a daemon of one node keeps for itself lives under that node's root (its munge
socket and key, slurmd's spool, the daemons' logs and pid files), so two nodes never share
one. Only slurmctld's state is on EFS, where a replacement master's slurmctld finds the queue.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# -- on a node, relative to its root ------------------------------------------------------
SLURM_ETC_DIR = "etc/slurm"
SLURM_CONF = f"{SLURM_ETC_DIR}/slurm.conf"
GRES_CONF = f"{SLURM_ETC_DIR}/gres.conf"
CGROUP_CONF = f"{SLURM_ETC_DIR}/cgroup.conf"
#: ``TaskProlog``: gives every task the DEEPLEARNING_* variables of the node it runs on.
TASK_PROLOG = f"{SLURM_ETC_DIR}/task_prolog.sh"
#: ``Prolog``: the health gate's node-local checks, run by slurmd as root before each job.
PROLOG = f"{SLURM_ETC_DIR}/prolog.sh"
#: The cluster's munge key: root writes it from Secrets Manager, 0400 owned by ``munge``.
MUNGE_KEY = "etc/munge/munge.key"
MUNGE_RUN_DIR = "run/munge"
MUNGE_SOCKET = f"{MUNGE_RUN_DIR}/munge.socket.2"
MUNGE_PID = f"{MUNGE_RUN_DIR}/munged.pid"
MUNGE_LOG = "var/log/munge/munged.log"
MUNGE_SEED = "var/lib/munge/munged.seed"
SLURM_RUN_DIR = "run/slurm"
SLURM_LOG_DIR = "var/log/slurm"
#: slurmd's spool (job scripts, slurmstepd's sockets: a Unix socket's path must stay under
#: 108 bytes, so nothing more is added below it).
SLURMD_SPOOL_DIR = "var/spool/slurmd"

# -- on EFS, relative to the mount point --------------------------------------------------
#: Root-owned parent of slurmctld's state (0755): nothing else lives here.
SLURM_EFS_DIR = "cluster/slurm"
#: ``StateSaveLocation``: the queue and the jobs' records, owned by SlurmUser, 0700.
SLURM_STATE_DIR = f"{SLURM_EFS_DIR}/state"

SLURM_LAYOUT = (SLURM_CONF, GRES_CONF, CGROUP_CONF, TASK_PROLOG, PROLOG, MUNGE_KEY, MUNGE_SOCKET,
                MUNGE_PID, MUNGE_LOG, MUNGE_SEED, f"{SLURM_RUN_DIR}/", f"{SLURM_LOG_DIR}/",
                f"{SLURMD_SPOOL_DIR}/", f"{SLURM_STATE_DIR}/")


@dataclass(frozen=True)
class SlurmPaths:
    """A node's Slurm and munge files under its root, and slurmctld's state under the EFS
    mount point ``efs``."""

    root: Path
    efs: Path

    def __init__(self, root: str | os.PathLike = "/", efs: str | os.PathLike = "/efs") -> None:
        object.__setattr__(self, "root", Path(root))
        object.__setattr__(self, "efs", Path(efs))

    @property
    def slurm_conf(self) -> Path:
        return self.root / SLURM_CONF

    @property
    def gres_conf(self) -> Path:
        return self.root / GRES_CONF

    @property
    def cgroup_conf(self) -> Path:
        return self.root / CGROUP_CONF

    @property
    def task_prolog(self) -> Path:
        return self.root / TASK_PROLOG

    @property
    def prolog(self) -> Path:
        return self.root / PROLOG

    @property
    def munge_key(self) -> Path:
        return self.root / MUNGE_KEY

    @property
    def munge_run_dir(self) -> Path:
        return self.root / MUNGE_RUN_DIR

    @property
    def munge_socket(self) -> Path:
        return self.root / MUNGE_SOCKET

    @property
    def munge_pid(self) -> Path:
        return self.root / MUNGE_PID

    @property
    def munge_log(self) -> Path:
        return self.root / MUNGE_LOG

    @property
    def munge_seed(self) -> Path:
        return self.root / MUNGE_SEED

    @property
    def run_dir(self) -> Path:
        return self.root / SLURM_RUN_DIR

    @property
    def log_dir(self) -> Path:
        return self.root / SLURM_LOG_DIR

    @property
    def spool_dir(self) -> Path:
        return self.root / SLURMD_SPOOL_DIR

    @property
    def efs_dir(self) -> Path:
        return self.efs / SLURM_EFS_DIR

    @property
    def state_dir(self) -> Path:
        return self.efs / SLURM_STATE_DIR

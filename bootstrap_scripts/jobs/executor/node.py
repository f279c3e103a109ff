"""The node a job executor runs on: the files its node agent wrote, the shared EFS, its address.

The executor never asks the network who it is: the node agent already decided (the
``DEEPLEARNING_*`` env file and the membership it applied), and emulated nodes on one
machine differ only by their root directory.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.engine.node_env import read_node_env
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths

LOG = logging.getLogger("dl-executor")


@dataclass
class ThisNode:
    """Where this executor's node keeps its files, where EFS is, and the node's address
    (empty until known: see the executor's ``resolve_address``)."""

    paths: NodePaths
    cluster: ClusterPaths
    address: str = ""

    def env(self) -> dict[str, str]:
        return read_node_env(self.paths)

    def membership(self) -> Membership | None:
        """The membership this node applied, None if there is none (yet) or it is unreadable."""
        try:
            return Membership.load(self.paths.membership)
        except (OSError, ValueError):
            return None

    def user_checkpoints(self, uid: int, gid: int) -> Path | None:
        """``checkpoints/<user>/`` of the job's owner (-1: root's own job), made by root in
        its root-owned parent and handed to the user, 0700: no other user may plant a
        checkpoint there. A non-root executor (a one-user development setup) leaves it to
        the job (None)."""
        if os.geteuid() != 0:
            return None
        return userfiles.user_dir(self.cluster.checkpoints_dir, max(uid, 0), max(gid, 0))

"""The node a job executor runs on: the files its node agent wrote, the shared EFS, its address.

The executor never asks the network who it is: the node agent already decided (the
``DEEPLEARNING_*`` env file and the membership it applied), and emulated nodes on one
machine differ only by their root directory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

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

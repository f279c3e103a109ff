"""What the role modules (:mod:`.master`, :mod:`.formation`, :mod:`.roster`, :mod:`.worker`)
need from the node agent that runs them, as a :class:`typing.Protocol`.

:class:`~bootstrap_scripts.agent.node_agent.NodeAgent` provides it; the role modules only
name this protocol, never ``node_agent``. So the agent's modules depend one way:
``node_agent`` -> ``master`` -> ``formation`` -> ``roster``, ``node_agent`` -> ``worker``, and
every one of them -> ``context`` (which imports none of them). tests/agent/test_import_cycles.py
fails on any circle.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from bootstrap_scripts.agent.identity import NodeIdentity
from bootstrap_scripts.agent.node_keys_queue import NodeKey
from bootstrap_scripts.agent.settings import AgentConfig
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths


class AgentContext(Protocol):
    """One node's agent as its role sees it."""

    config: AgentConfig
    identity: NodeIdentity
    log: logging.Logger
    cluster: ClusterPaths
    paths: NodePaths
    #: this node's GPU count (from nvidia-smi).
    gpus: int
    #: the membership this node applied last (None before the first).
    current: Membership | None
    #: set once the cluster is formed (or resumed, or taken over).
    formed: threading.Event
    #: set to stop every loop.
    stop: threading.Event
    #: worker: this node is being drained (no more heartbeats).
    draining: bool
    #: this node's signing key (``node_keys_queue.NodeKey``; set at boot).
    node_key: NodeKey | None

    def apply(self, m: Membership) -> bool:
        """Apply ``m`` on this node; True if it lists this node."""
        ...

    def signal(self, status: str, reason: str, data: str = "") -> None:
        """Signal the stack's wait condition (the master)."""
        ...

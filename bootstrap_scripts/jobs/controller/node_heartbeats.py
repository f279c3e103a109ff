"""The job controller believes an executor heartbeat only from the node it names.

The controller marks an instance Unhealthy when root's own evidence, the node's executor
heartbeat (``cluster/executors/<address>.json``), says the node is lost
(:mod:`.node_evidence`), and gives attempts only to executors seen alive. Root on any worker
can write that file on EFS: a forged heartbeat would keep a dead node "alive" (no mark, an
attempt placed on it) or make a live one look stopped. So, on a master that learns node keys
(``bootstrap_scripts.node.node_keys``), a heartbeat counts only when the node the membership puts
at that address signed it (the membership is the master's own, on its disk), and only when
it is not older than one already seen (``started_at``, ``seq``; the rule is
``reachability.LatestBeats``, which ``dl-health`` follows too): a record of the node's own
replayed from before is no beat. What does not count is as if the file had not changed:
the last heartbeat believed stays the latest, so a node that only forgeries speak for goes
silent and is judged by the one rule (:mod:`bootstrap_scripts.protocol.liveness`).

A node whose key the master has not learnt yet (seconds, after a master takes over: every
worker sends its key again on a new master) is read as before, unchecked and logged, by the
rule every reader of node records follows (``node_keys.RecordCheck.judge_or_plain``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from bootstrap_scripts.jobs.engine.reachability import REPLAY, LatestBeats, read_heartbeat
from bootstrap_scripts.node.node_keys import RecordCheck
from bootstrap_scripts.protocol.membership import Membership, MembershipError
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat

LOG = logging.getLogger("dl-controller")


class SignedHeartbeats:
    """``read(efs, address)`` for :class:`~bootstrap_scripts.jobs.engine.reachability.
    Executors`: the latest heartbeat of ``address`` its node signed (plain reads on a master
    without node keys)."""

    def __init__(self, root: Path, log: logging.Logger = LOG) -> None:
        self.paths = NodePaths(root)
        self.check = RecordCheck.for_node(self.paths, log)
        self.latest = LatestBeats()
        self._membership: tuple[tuple[int, int], Membership | None] | None = None

    def instance_at(self, address: str) -> str:
        """The instance the master's applied membership puts at ``address`` ("": none)."""
        path = self.paths.membership
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size)
            if self._membership is None or self._membership[0] != stamp:
                self._membership = (stamp, Membership.load(path))
        except (OSError, MembershipError):
            return ""
        m = self._membership[1]
        node = m.node_by_address(address) if m else None
        return node.instance_id if node else ""

    def __call__(self, efs: Path, address: str) -> ExecutorHeartbeat | None:
        if not self.check.active:
            return read_heartbeat(efs, address)
        path = ClusterPaths(efs).executor_heartbeat(address)
        instance = self.instance_at(address)
        if not instance:
            self.check.refuse(path, f"no member of the membership at {address}")
            return self.latest.get(address)
        judged = self.check.judge_or_plain(path, ExecutorHeartbeat, instance_id=instance,
                                           what="executor heartbeat",
                                           plain=lambda: read_heartbeat(efs, address),
                                           fields={"address": address})
        if judged.why:
            self.check.refuse(path, judged.why)
        if not judged.learnt:  # read unchecked: no replay check, nothing remembered
            return judged.record
        beat, replay = self.latest.take(address, judged.record)
        if replay:
            self.check.refuse(path, REPLAY)
        return beat


_READERS: dict[str, SignedHeartbeats] = {}


def reader(root: Path) -> SignedHeartbeats:
    """The one reader of this controller (its memory of the latest beats is shared by every
    supervisor it runs)."""
    key = str(root)
    if key not in _READERS:
        _READERS[key] = SignedHeartbeats(root)
    return _READERS[key]

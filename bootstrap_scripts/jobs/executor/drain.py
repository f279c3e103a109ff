"""Draining this node: the master agent asks it to leave the cluster.

A drain request naming this node's address makes its executor stop every share (SIGTERM
to torchrun only, which stops its workers WITHOUT closing the rendezvous for the others;
SIGKILL after the grace), start nothing new, and write ``cluster/drain/<instance-id>.done``
once nothing runs: the master then completes the lifecycle action. The request it acts on
is the node-local copy its agent made (``var/lib/dl-agent/drain.json``) after checking the
master signed the one on EFS (``bootstrap_scripts.agent.worker.accept_drain``), never a
file on EFS, which root on any worker can write.
"""

from __future__ import annotations

import logging
import os
import time

from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.shares import Shares
from bootstrap_scripts.node import node_keys
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.records import DrainDone, DrainRecord

LOG = logging.getLogger("dl-executor")


class Drain:
    """Whether this node is being drained, and the drain's progress."""

    def __init__(self, node: ThisNode, shares: Shares) -> None:
        self.node = node
        self.shares = shares
        #: (instance id, request) once a drain request names this node
        self.request: tuple[str, DrainRecord] | None = None
        self.done = False
        #: the ``.done`` is signed with the node's own key: the master believes only that
        self.signer = node_keys.NodeSigner(node.paths)

    @property
    def requested(self) -> bool:
        return self.request is not None

    def find_request(self) -> tuple[str, DrainRecord] | None:
        req = store.read_record_or_none(self.node.paths.applied_drain, DrainRecord)
        if req is None or req.address != self.node.address:
            return None
        return req.instance_id, req

    def check(self) -> None:
        if self.request is None:
            self.request = self.find_request()
            if self.request is None:
                return
            LOG.info("drain requested for %s (%s): stopping %d share(s)",
                     self.request[0], self.node.address, len(self.shares.running))
        for r in self.shares.running.values():
            if not r.cancel_reason:
                r.drained = True
                self.shares.cancel(r, "drained: node leaving the cluster")
        if not self.shares.running and not self.done:
            instance_id, req = self.request
            store.atomic_write(self.node.cluster.drain_done(instance_id), self.signer.signed(
                DrainDone(instance_id=instance_id, address=self.node.address,
                          requested_at=req.requested_at, done_at=time.time(),
                          executor_pid=os.getpid()).to_json()))
            self.done = True
            LOG.info("drain of %s done: no share running", instance_id)

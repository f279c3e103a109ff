"""An elastic attempt while it runs: late nodes admitted, lost nodes marked.

An ``--elastic`` job's attempt does not end when a node is lost (torchrun carries on
without it) and does not start again for a replacement (it joins the running attempt). So
the two node checks that a fixed-size job makes between attempts are made here, on every
look :meth:`running_attempt.RunningAttempt.follow` takes while the attempt runs:

- :meth:`ElasticAttempt.mark_lost`: a node of the attempt whose executor heartbeat is lost
  is marked Unhealthy and excluded at once, on root's own evidence
  (``node_evidence.losses``: never the master, never a node that is leaving, within the
  circuit breaker), so that Auto Scaling's replacement does not wait for EC2's checks;
- :meth:`ElasticAttempt.grow`: a late node (that replacement) passes the health gate and is
  admitted into the running attempt (``rejoin.py``); once its share started, the job's
  record says the job grew back.

:class:`ElasticAttempt` is a part of :class:`supervise.JobSupervisor` (a base class of it,
through ``running_attempt.RunningAttempt``): it works on the supervisor's record and nodes
(``job``, ``efs``, ``executors``, ``health``, ``budget``, ``watch``, ``last_nodes_addresses``,
``update``, ``update_last_restart``, ``ready_nodes``, ``membership``, ``run_gate``), which
the supervisor defines.
"""

from __future__ import annotations

import logging
import time

from bootstrap_scripts.jobs.controller import attempts, node_evidence, rejoin
from bootstrap_scripts.jobs.engine.restart_policy import join_restarts_workers
from bootstrap_scripts.protocol.state import drains

LOG = logging.getLogger("dl-controller")


class ElasticAttempt:
    """The elastic checks of a running attempt (a base of ``JobSupervisor``)."""

    def grow(self, grow: rejoin.Rejoin) -> None:
        """Elastic: a late node (a replacement) gated and admitted into the running attempt;
        once its share started, the record says the job grew back."""
        admitted, joined = grow.step(self.ready_nodes()[0], running=self.last_nodes_addresses,
                                     excluded=self.job.excluded, alive=self.executors.alive,
                                     gate=self.run_gate)
        before = len((self.last_nodes_addresses | grow.joined) - grow.lost) - len(joined)
        if joined and self.watch is not None and join_restarts_workers(
                attempts.attempt_nnodes(grow.jpaths, self.request.run,
                                        len(self.last_nodes_addresses)), before):
            self.watch.restart_clock()  # torchrun restarts every worker to take it in
        if joined:  # grew back, or past its first size (a scale-up): what runs now, and
            # the joined nodes charged from now (the ledger's nodes are those that ran)
            m = self.ready_nodes()[0] or self.membership()
            new = [n for n in (m.nodes if m else ()) if n.address in set(joined)]
            self.update(world_size=len(self.running_nodes(grow)),
                        usage=self.budget.joined(self.job, new))
        if self.job.restart_log and (admitted or joined):
            self.update_last_restart(admitted_instance_ids=",".join(grow.admitted.values()),
                                     **({"joined_at": time.time()} if joined else {}))

    def running_nodes(self, grow: rejoin.Rejoin) -> set[str]:
        """The addresses the attempt runs on now, from what ran: its nodes and those that
        joined, less those lost (the record's ``world_size``)."""
        return (self.last_nodes_addresses | grow.joined) - grow.lost

    def mark_lost(self, grow: rejoin.Rejoin) -> None:
        """Elastic: a node of the running attempt whose executor heartbeat is lost is marked
        Unhealthy and excluded now (``node_evidence.losses``): the attempt trains on without
        it and never ends to say so; its replacement must not wait for EC2's checks alone."""
        # an admitted node that has not started its share yet is watched too: a loss while
        # the generation rises is a loss
        watched = (self.last_nodes_addresses | grow.joined | set(grow.admitted)) - grow.lost
        gone = self.executors.gone(watched)
        if not gone:
            return
        grow.lost.update(gone)
        if self.watch is not None:  # lost or drained: the others' workers restart without it
            self.watch.restart_clock()
        m, live = self.membership(), self.ready_nodes()[0]
        nodes = [*(m.nodes if m else ()), *(live.nodes if live else ())]
        losses = node_evidence.losses(gone, attempt=self.job.attempt, nodes=nodes,
                                      master_instance=m.master.instance_id if m else "",
                                      mark=self.health.mark_unhealthy,
                                      leaving=drains(self.efs))
        if not losses:
            return
        for loss in losses:
            LOG.warning("job %s: node %s (%s) lost during attempt %d: %s%s", self.job.job_id,
                        loss.address, loss.instance_id, loss.attempt, loss.detail,
                        f" [{loss.health_error}]" if loss.health_error else "")
        marked = {x.instance_id for x in losses if x.marked_unhealthy}
        self.update(node_losses=(*self.job.node_losses, *losses),
                    world_size=len(self.running_nodes(grow)),
                    usage=self.budget.left(self.job, (x.instance_id for x in losses)),
                    excluded=tuple(sorted({*self.job.excluded, *marked})),
                    last_failure=f"node-lost: {losses[-1].address} ({losses[-1].instance_id})"
                    f": {losses[-1].detail}")

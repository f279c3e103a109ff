"""A managed job's cost ledger and its ``--max-cost`` cap, as the supervisor keeps them.

Each attempt gets an :class:`AttemptUsage` in ``job.json`` when it starts (its nodes priced
by ``ops/prices.PriceBook``: DescribeInstances, the Price List, the Spot price history,
cached on EFS) and its end time when it ends; ``ops/cost`` sums them. With a cap, the
supervisor asks :meth:`JobBudget.stop_reason` at every poll of a running attempt: once the
cost reaches the cap it stops the attempt through the attempt's cancel file, the way a
user's cancel does (every rank gets SIGTERM and the job's grace period to checkpoint), and
the job ends ``budget``, not restarted. A capped job whose nodes cannot be priced is not
run on: a cap that cannot be counted is not kept by running on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from decimal import Decimal

from bootstrap_scripts.ops import cost
from bootstrap_scripts.ops.prices import PriceBook
from bootstrap_scripts.protocol.managed_records import (
    AttemptUsage,
    ManagedJob,
    ManagedRequest,
    NodeUsage,
)
from bootstrap_scripts.protocol.membership import Node


class JobBudget:
    """The ledger's bookkeeping and the cap of one job."""

    def __init__(self, request: ManagedRequest, prices: PriceBook | None) -> None:
        #: the cap; a request whose cap is not one (written by hand: dl-run checks it) has
        #: ``problem`` naming --max-cost and the value, and the job fails with it
        self.cap: Decimal | None = None
        self.problem = ""
        try:
            self.cap = cost.parse_usd(request.max_cost_usd) if request.max_cost_usd else None
        except ValueError as exc:
            self.problem = str(exc)
        self.prices = prices
        #: why the running attempt was stopped at the cap ("" while it was not)
        self.stopped = ""

    def start(self, job: ManagedJob, attempt: int, nodes: Iterable[Node],
              at: float | None = None) -> tuple[AttemptUsage, ...]:
        """The job's usage with attempt ``attempt`` started now on ``nodes``, priced."""
        at = time.time() if at is None else at
        return (*job.usage, AttemptUsage(attempt=attempt, started_at=at,
                                         nodes=self.price(nodes, at)))

    def price(self, nodes: Iterable[Node], at: float) -> tuple[NodeUsage, ...]:
        """``nodes`` priced at ``at`` (unpriced, saying why, without a price book)."""
        nodes = list(nodes)
        if self.prices is not None:
            return self.prices.node_usage(nodes, at)
        return tuple(cost.unpriced(n.instance_id, n.instance_type,
                                   "the job controller prices no node (no price book)")
                     for n in nodes)

    def joined(self, job: ManagedJob, nodes: Iterable[Node], at: float | None = None
               ) -> tuple[AttemptUsage, ...]:
        """The job's usage with ``nodes`` joined its running (last) attempt at ``at`` (an
        elastic join): charged from then on. Nodes already in it are left as they are."""
        if not job.usage or job.usage[-1].ended_at is not None:
            return job.usage
        at = time.time() if at is None else at
        last = job.usage[-1]
        there = {n.instance_id for n in last.nodes if n.left_at is None}
        new = [n for n in nodes if n.instance_id not in there]
        if not new:
            return job.usage
        priced = tuple(dataclasses.replace(u, joined_at=at) for u in self.price(new, at))
        return (*job.usage[:-1], dataclasses.replace(last, nodes=(*last.nodes, *priced)))

    @staticmethod
    def left(job: ManagedJob, instance_ids: Iterable[str], at: float | None = None
             ) -> tuple[AttemptUsage, ...]:
        """The job's usage with ``instance_ids`` lost from its running (last) attempt at
        ``at`` (it trained on without them): charged until then."""
        if not job.usage or job.usage[-1].ended_at is not None:
            return job.usage
        at = time.time() if at is None else at
        gone = set(instance_ids)
        last = job.usage[-1]
        nodes = tuple(dataclasses.replace(n, left_at=at)
                      if n.instance_id in gone and n.left_at is None else n
                      for n in last.nodes)
        return (*job.usage[:-1], dataclasses.replace(last, nodes=nodes))

    @staticmethod
    def end(job: ManagedJob, attempt: int, at: float | None = None
            ) -> tuple[AttemptUsage, ...]:
        """The job's usage with attempt ``attempt`` ended at ``at`` (unchanged if it is not
        the last one, or already ended)."""
        if not job.usage or job.usage[-1].attempt != attempt or \
                job.usage[-1].ended_at is not None:
            return job.usage
        at = time.time() if at is None else at
        return (*job.usage[:-1], dataclasses.replace(job.usage[-1], ended_at=at))

    def stop_reason(self, job: ManagedJob, now: float | None = None) -> str:
        """Why the job must stop now at its cap ("" while it may run on)."""
        if self.cap is None:
            return ""
        ledger = cost.job_cost(job.usage, time.time() if now is None else now)
        verdict = cost.check_cap(ledger, self.cap)
        if verdict is cost.CapVerdict.UNDER:
            return ""
        return cost.cap_message(verdict, ledger, self.cap)

"""Elastic jobs on a node that joins the cluster while they run.

A running elastic job's spec names the membership generation it started with. Once this
node appears in a newer generation, its executor claims the first free share rank (with
O_EXCL: several nodes may join at once and nobody hands out numbers) and starts the
spec's ``join_template`` with its own address: torchrun's c10d rendezvous admits the new
agent, the others restart their workers, which resume from the latest step checkpoint.
An attempt of a managed job (``join_admission``) is joined only once the job controller
wrote ``admitted/<address>``: its health gate passed on this node.
"""

from __future__ import annotations

import logging
import time

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.engine.userfiles import as_user
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.probation import STARTUP_LIVENESS_SECONDS, RunnerProbation
from bootstrap_scripts.jobs.executor.share_command import job_owner
from bootstrap_scripts.jobs.executor.shares import Shares
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Share, join_share
from bootstrap_scripts.protocol.paths import SHARE_CLAIM_SUFFIX, JobPaths
from bootstrap_scripts.protocol.records import ShareClaim

LOG = logging.getLogger("dl-executor")


def admitted(paths: JobPaths, address: str) -> bool:
    """The job controller admitted ``address`` into the attempt: its file is there, opened
    (EFS: open, not stat) without following a link anywhere a user could plant one, and the
    job user's (the controller writes it as them; ``userfiles.exists``)."""
    try:
        return userfiles.exists(paths.admitted(address))
    except OSError:
        return False


class ElasticJoins:
    """Elastic jobs without a share for this node, waiting for a generation that adds it."""

    def __init__(self, node: ThisNode, shares: Shares) -> None:
        self.node = node
        self.shares = shares
        self.waiting: dict[str, tuple[JobSpec, JobPaths]] = {}
        self.probation = RunnerProbation()

    def joined_share(self, spec: JobSpec, paths: JobPaths) -> Share | None:
        """The share this node claimed in an elastic job earlier (an executor restart)."""
        if not spec.elastic or spec.join_template is None:
            return None
        for _, claim in userfiles.scan(paths.nodes, ShareClaim, suffix=SHARE_CLAIM_SUFFIX):
            if claim.address == self.node.address:
                return join_share(spec.join_template, claim.rank, self.node.address)
        return None

    def wait(self, spec: JobSpec, paths: JobPaths) -> None:
        """Remember an elastic job this node may join once a generation lists it."""
        self.waiting[paths.key] = (spec, paths)

    def join(self, *, draining: bool) -> None:
        """Start this node's share of every waiting job whose start predates the generation
        that added this node, if the job's runner is alive (never join a dead job)."""
        if not self.waiting or draining:
            return
        m = self.node.membership()
        generation = m.generation if m else 0
        addresses = [n.address for n in m.nodes] if m else []
        for job_id, (spec, paths) in list(self.waiting.items()):
            if userfiles.exists(paths.done) or userfiles.exists(paths.cancel):
                del self.waiting[job_id]
                continue
            if generation <= spec.generation or self.node.address not in addresses:
                continue
            if spec.join_admission and not admitted(paths, self.node.address):
                continue  # the controller gates this node first (it stays waiting)
            verdict = self.probation.check(job_id, paths,
                                           max(STARTUP_LIVENESS_SECONDS, spec.orphan_timeout))
            if verdict == RunnerProbation.DEAD:
                LOG.info("job %s: runner not alive, not joining it", job_id)
                del self.waiting[job_id]
                continue
            if verdict == RunnerProbation.WAITING:
                continue
            if not self.shares.credentials_ready(paths):
                continue  # STS answers on its thread: the loop never waits on AWS
            del self.waiting[job_id]
            assert spec.join_template is not None
            try:
                with as_user(*job_owner(paths)):  # a claim in the user's directory
                    rank = self.claim_rank(spec, paths, generation)
            except OSError as exc:
                LOG.error("job %s: cannot claim a rank, not joining it: %s", job_id, exc)
                continue
            share = join_share(spec.join_template, rank, self.node.address)
            LOG.info("job %s: joining the elastic job as node rank %d (generation %d > %d)",
                     job_id, rank, generation, spec.generation)
            self.shares.start(spec, share, paths)

    def claim_rank(self, spec: JobSpec, paths: JobPaths, generation: int) -> int:
        """The first free share rank after the spec's, claimed with O_EXCL."""
        rank = max(s.rank for s in spec.shares) + 1
        while not store.create_exclusive(paths.claim(rank), ShareClaim(
                rank=rank, address=self.node.address, generation=generation,
                claimed_at=time.time()).to_json()):
            rank += 1
        return rank

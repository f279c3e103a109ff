"""Finding the jobs this node has to run: a scan of ``<EFS>/jobs/`` every poll.

A job directory is looked at until its fate on this node is settled (``seen``): started,
not for this node, finished, cancelled, or never given a spec. Jobs found at start-up (and
jobs whose spec appeared while their runner looked dead) are only started once their
runner's heartbeat moves: a rebooting node must not replay old jobs.
"""

from __future__ import annotations

import logging
import os
import time

from bootstrap_scripts.jobs.executor.drain import Drain
from bootstrap_scripts.jobs.executor.elastic import ElasticJoins
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.shares import STARTUP_LIVENESS_SECONDS, RunnerProbation, Shares
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.paths import JobPaths

LOG = logging.getLogger("dl-executor")

#: A job directory with no spec.json after this long is a dry run or a crashed runner.
SPECLESS_GIVE_UP_SECONDS = 60.0


class JobScanner:
    """The jobs of ``<EFS>/jobs/`` and what this node does about each."""

    def __init__(self, node: ThisNode, shares: Shares, joins: ElasticJoins,
                 drain: Drain) -> None:
        self.node = node
        self.shares = shares
        self.joins = joins
        self.drain = drain
        self.seen: set[str] = set()
        self.specless: dict[str, float] = {}
        self.probation = RunnerProbation()  # jobs found at start-up
        self.first_scan = True

    def read_spec(self, job_id: str, paths: JobPaths, now: float) -> JobSpec | None:
        """The job's spec; None while it has none yet, or (then ``seen``) never will."""
        try:
            text = store.read_text(paths.spec)
            if text is None:
                first = self.specless.setdefault(job_id, now)
                if now - first > SPECLESS_GIVE_UP_SECONDS:
                    self.seen.add(job_id)
                return None
            return JobSpec.from_json(text)
        except (OSError, ProtocolError) as exc:
            LOG.error("job %s: unreadable spec, ignoring it: %s", job_id, exc)
            self.seen.add(job_id)
            return None

    def scan(self) -> None:
        try:
            entries = [e.name for e in os.scandir(self.node.cluster.jobs_dir) if e.is_dir()]
        except FileNotFoundError:
            entries = []
        now = time.monotonic()
        for job_id in entries:
            if job_id in self.seen or job_id in self.shares.running or job_id.startswith("."):
                continue
            try:
                paths = self.node.cluster.job(job_id)
            except ProtocolError:  # not a job id: nobody published it as a job
                self.seen.add(job_id)
                continue
            if store.exists(paths.done) or store.exists(paths.cancel):
                self.seen.add(job_id)
                continue
            spec = self.read_spec(job_id, paths, now)
            if spec is None:
                continue
            self.consider(spec, paths)
        self.first_scan = False

    def consider(self, spec: JobSpec, paths: JobPaths) -> None:
        """Start this node's share of ``spec`` if it has one and nothing speaks against it."""
        job_id = paths.job_id
        share = spec.share_for(self.node.address) or self.joins.joined_share(spec, paths)
        if share is None and spec.elastic and spec.join_template is not None:
            self.joins.wait(spec, paths)
            self.seen.add(job_id)
            return
        if share is not None and self.first_scan and store.exists(paths.started(share.rank)) \
                and not store.exists(paths.exit(share.rank)):
            self.shares.clean_up_orphan(spec, share, paths)
        if share is None or store.exists(paths.exit(share.rank)) or \
                store.exists(paths.started(share.rank)):
            self.seen.add(job_id)
            return
        if self.drain.requested:
            self.seen.add(job_id)  # leaving the cluster: no new work
            return
        if self.first_scan or self.probation.watching(job_id):
            verdict = self.probation.check(job_id, paths, STARTUP_LIVENESS_SECONDS)
            if verdict == RunnerProbation.DEAD:
                LOG.info("job %s: runner not alive, not starting it", job_id)
                self.seen.add(job_id)
            if verdict != RunnerProbation.ALIVE:
                return
        if not self.shares.start(spec, share, paths):
            self.seen.add(job_id)

"""A controller's take-over: continuing the jobs a previous controller left running or
restarting (a restarted controller, or a new master's after the old one was lost).

What it believes of its predecessor is only what the master signed (``sealed``): a job
whose record cannot be trusted is failed saying why, not rebuilt from a user's file. A job
whose attempt still runs is re-attached; an orphaned attempt is cancelled through its
cancel file (as the job's user) and the job restarts as ``master-lost`` under the restart
policy. Kept apart from ``daemon`` so the service's loop and its take-over read apart;
:class:`Takeover` is mixed into ``daemon.Controller``, whose attributes it uses.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import time

from bootstrap_scripts.jobs.controller import attempts, sealed
from bootstrap_scripts.jobs.engine import managed, userfiles
from bootstrap_scripts.jobs.engine.classify import Failure, FailureKind
from bootstrap_scripts.jobs.engine.restart_policy import Action, JobState, decide
from bootstrap_scripts.jobs.engine.userfiles import as_owner_of
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths, ManagedPaths, NodePaths

LOG = logging.getLogger("dl-controller")
#: how long a take-over waits for an orphaned attempt's shares to stop
ORPHAN_STOP_TIMEOUT = 60.0
#: the controller's pass (the daemon's loop uses it too)
POLL_SECONDS = 0.5


class Takeover:
    """The take-over half of the job controller (module doc)."""

    def recover(self) -> None:
        """Continue the jobs a previous controller left running or restarting."""
        for paths in managed.all_paths(self.efs):
            found = sealed.recovered_job(self.seal, self.efs, paths)  # the master's record
            job = found.job
            request, problem = managed.checked_request(paths, self.verify_root)
            if job is None or request is None or job.controller == self.me or \
                    job.state not in sealed.RESUMABLE:
                if found.later:
                    LOG.error("job %s: not recovered: its record cannot be checked now",
                              paths.key)
                continue
            if problem != "":  # a planted root job (or KMS down: the next pass looks again)
                LOG.error("job %s: not recovered: %s", paths.key, problem or "cannot check")
                continue
            try:
                if found.distrust:
                    self.fail_untrusted(paths, request, job, found.distrust)
                    continue
                if found.signed:  # the cap the job was picked up with, not a rewritten one
                    request = dataclasses.replace(request, max_cost_usd=job.max_cost_usd)
                self.recover_job(paths, request, job)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                self.pending_records.fail(paths, job, exc)
            if self.stopping:
                return

    def fail_untrusted(self, paths: ManagedPaths, request: ManagedRequest, job: ManagedJob,
                       why: str) -> None:
        """Stop the job's attempt and fail it, saying why (``sealed.recovered_job``)."""
        LOG.error("job %s: %s", paths.key, why)
        if job.state == JobState.RUNNING.value and job.attempt:
            self.stop_orphan(paths, job)
        sup = self.supervisor(paths, request, job)
        sup.update(controller=self.me)
        sup.finish(JobState.FAILED, why)

    def recover_job(self, paths: ManagedPaths, request: ManagedRequest, job: ManagedJob
                    ) -> None:
        """Re-attach to the job's attempt if it still runs (or ended while no controller
        was there); otherwise its attempt is an orphan: stop it, restart as master-lost."""
        sup = self.supervisor(paths, request, job)
        previous = job.controller
        sup.update(controller=self.me)
        if job.state == JobState.RUNNING.value and job.attempt:
            attempt = ClusterPaths(self.efs).job(paths.attempt_key(job.attempt))
            if attempts.runner_alive(attempt) or userfiles.exists(attempt.result):
                LOG.info("job %s: re-attaching to attempt %d (its runner outlived the "
                         "previous controller %s)", job.job_id, job.attempt, previous)
                self.run_job(sup, reattach=True)
                return
        if job.state == JobState.RUNNING.value and job.attempt:
            self.stop_orphan(paths, job)
            failure = Failure(FailureKind.MASTER_LOST, f"the job controller that ran "
                              f"attempt {job.attempt} ({previous}) is gone")
            decision = decide(failure, restarts=job.restarts,
                              code_restarts=job.code_restarts, policy=sup.policy,
                              cancel_requested=managed.cancel_requested(paths))
            if decision.action is Action.RESTART:
                m = self.wait_membership()
                if m is None:
                    return
                sup.record_restart(m, failure, time.time())
            else:
                sup.finish(decision.state, decision.reason)
        else:
            LOG.info("job %s: continuing its restart (previous controller %s is gone)",
                     job.job_id, previous)
        self.run_job(sup)

    def wait_membership(self) -> Membership | None:
        """This node's membership, once the node agent has written it: a controller that
        starts on a new master (a take-over) may be up before its agent formed the cluster.
        None if the controller is told to stop first."""
        path = NodePaths(self.root).membership
        announced = False
        while not self.stopping:
            try:
                return Membership.load(path)
            except (OSError, ValueError) as exc:
                if not announced:
                    LOG.info("waiting for this node's membership (%s): %s", path, exc)
                    announced = True
            self.beat("waiting")
            time.sleep(POLL_SECONDS)
        return None

    def stop_orphan(self, paths: ManagedPaths, job: ManagedJob) -> None:
        """Cancel the orphaned attempt and wait until its shares stopped."""
        jpaths = ClusterPaths(self.efs).job(paths.attempt_key(job.attempt))
        LOG.warning("job %s: attempt %d is orphaned (its controller %s is gone): stopping it",
                    job.job_id, job.attempt, job.controller)
        try:
            with as_owner_of(jpaths.dir):  # the user's directory: as the user, no link
                store.atomic_write(jpaths.cancel, "orphaned: the job controller was lost\n")
        except OSError as exc:
            LOG.error("cannot cancel %s: %s", jpaths.dir, exc)
        if not attempts.wait_stopped(jpaths, self.efs, timeout=ORPHAN_STOP_TIMEOUT,
                                     tick=self.beat, root=self.root):
            LOG.error("job %s: attempt %d still has running shares after %.0f s", job.job_id,
                      job.attempt, ORPHAN_STOP_TIMEOUT)

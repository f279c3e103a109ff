"""An attempt while it runs: the look :meth:`RunningAttempt.follow` takes every half second.

Started by this controller (``supervise.JobSupervisor.run_attempt``) or by a previous one
(``reattach``), an attempt is followed the same way until its runner ends:

- a user's cancel, a stopping controller or the job's cost cap (``budget.py``) is passed
  on to the attempt's cancel file at once;
- after a restart, the seconds until every share started again go into the restart record;
- an ``--elastic`` attempt's lost nodes are marked and its late nodes admitted
  (``elastic_attempt.py``);
- every ``WATCH_SECONDS`` its ranks' progress is read (``hangs.py``): stragglers into the
  job's record; an attempt with no progress for ``--hang-timeout`` has its stacks dumped and
  is stopped, and ends ``hang`` (:meth:`RunningAttempt.hang_or`).

:class:`RunningAttempt` is a part of :class:`supervise.JobSupervisor` (its base class): it
works on the supervisor's record and nodes (``job``, ``request``, ``paths``, ``root``,
``efs``, ``uid``, ``gid``, ``budget``, ``executors``, ``rejoin``, ``hang``, ``watch``,
``dump_stacks``, ``last_nodes_addresses``, ``tick``, ``stopping``, ``update``,
``update_last_restart``, ``membership``), which the supervisor defines.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from bootstrap_scripts.jobs.controller import attempts, hangs
from bootstrap_scripts.jobs.controller.elastic_attempt import ElasticAttempt
from bootstrap_scripts.jobs.engine import managed, userfiles
from bootstrap_scripts.jobs.engine.classify import Failure
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import USER_CANCEL_REASON
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import JobPaths

LOG = logging.getLogger("dl-controller")

POLL_SECONDS = 0.5
#: elastic: an executor whose heartbeat stood still this long may be lost, and its loss
#: restarts the survivors' workers: no hang is judged until the liveness rule decided
QUIET_SECONDS = 3.0
#: how often a running attempt's progress files are read (hangs, stragglers)
WATCH_SECONDS = 1.0


class RunningAttempt(ElasticAttempt):
    """Following a running attempt to its end (a base of ``JobSupervisor``)."""

    def follow(self, jpaths: JobPaths, running: Callable[[], bool]) -> None:
        """While the attempt runs: pass a cancel on, stop it at the job's cost cap, note
        when a restart resumed, watch its progress (hangs, stragglers), beat."""
        cancel_sent = False
        pending_resume = bool(self.job.restart_log and
                              self.job.restart_log[-1].seconds_to_resume is None)
        self.hang = None
        watch = self.watch = hangs.HangWatch(jpaths, uid=self.uid, gid=self.gid,
                                             hang_timeout=self.request.run.hang_timeout)
        if self.job.stragglers or self.job.stalled:
            self.update(stragglers=(), stalled="")
        next_look = 0.0
        while running():
            if not cancel_sent and not self.stopping():
                self.budget.stopped = self.budget.stop_reason(self.job)
            if not cancel_sent and (managed.cancel_requested(self.paths) or self.stopping()
                                    or self.budget.stopped):
                why = self.budget.stopped or (
                    USER_CANCEL_REASON if managed.cancel_requested(self.paths)
                    else "cancelled by the job controller")
                with userfiles.as_user(self.uid, self.gid):  # the user's job directory
                    store.atomic_write(jpaths.cancel, why + "\n")
                if self.budget.stopped:
                    LOG.warning("job %s: %s", self.job.job_id, self.budget.stopped)
                cancel_sent = True
            if pending_resume:
                pending_resume = not self.note_resumed(jpaths)
            if not cancel_sent and self.rejoin is not None and self.rejoin.due():
                self.mark_lost(self.rejoin)
                self.grow(self.rejoin)
            if not cancel_sent and self.uid >= 0 and time.monotonic() >= next_look:
                next_look = time.monotonic() + WATCH_SECONDS
                cancel_sent = self.look_at_progress(watch)
            self.tick()
            time.sleep(POLL_SECONDS)
        if pending_resume:
            self.note_resumed(jpaths)

    def look_at_progress(self, watch: hangs.HangWatch) -> bool:
        """One look at the ranks' progress: stragglers into the record; a hang handled
        (stacks, report, the attempt cancelled: True)."""
        # Once a share ended, the ranks stop reporting by design: its end is the runner's
        # business (exits, --fail-grace), never a hang.
        if self.rejoin is not None:  # elastic: a lost node's verdict before any hang's
            self.mark_lost(self.rejoin)
        hang = watch.check() if not attempts.exits(watch.jpaths) else None
        if hang is not None and self.rejoin is not None and self.executors.quiet(
                (self.last_nodes_addresses | self.rejoin.joined) - self.rejoin.lost,
                QUIET_SECONDS):
            hang = None  # a node may be lost (its survivors restart): judged once it is
        lagging = watch.stragglers()
        if lagging != self.job.stragglers:
            self.update(stragglers=lagging)
        stalled = watch.stall() if hang is None else ""
        if stalled != self.job.stalled:  # seen while it lasts, hang watch or not
            self.update(stalled=stalled)
        if hang is None:
            return False
        LOG.warning("job %s: attempt %d made no progress for %.0f s: dumping stacks",
                    self.job.job_id, self.job.attempt, hang.seconds)
        m = self.membership()
        if m is not None and self.rejoin is not None and self.rejoin.lost:  # none to ask
            m = dataclasses.replace(m, nodes=tuple(n for n in m.nodes
                                                   if n.address not in self.rejoin.lost))
        self.hang, rep = hangs.handle(watch, hang, attempt=self.job.attempt,
                                      m=m, dump=self.dump_stacks,
                                      report_path=self.paths.attempt_hang(self.job.attempt))
        LOG.warning("job %s: hang: %s", self.job.job_id, rep.reason)
        return True

    def dump_stacks_on_nodes(self, m: Membership, job_id: str, uid: int, gid: int
                             ) -> tuple[dict[int, dict], str]:
        """py-spy on every node as root, in the controller's own interpreter (never the
        job's ``--python``: root runs no program a user chose)."""
        from bootstrap_scripts.ops.hang_stacks import dump_stacks  # only when a job hangs
        return dump_stacks(self.root, self.efs, m, job_id=job_id, uid=uid, gid=gid)

    def hang_or(self, failure: Failure | None) -> Failure | None:
        """The attempt's failure: ``hang`` when the watch stopped it (its shares then ended
        as cancelled), else what the classifier said."""
        return self.hang if self.hang is not None else failure

    def note_resumed(self, jpaths: JobPaths) -> bool:
        """Once every share of the attempt started: seconds from the failure's detection."""
        started = attempts.shares_started_at(jpaths)
        if started is None or not self.job.restart_log:
            return False
        self.update_last_restart(
            seconds_to_resume=round(max(0.0, started - self.job.restart_log[-1].at), 2))
        return True

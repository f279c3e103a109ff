"""What the job controller believes of its predecessor's records (``engine.controller_records``).

A new controller (restarted, or a new master's after a take-over) reads back two things it
must not take from anyone but the master: each job's record, which it resumes from
(:func:`recovered_job`), and the circuit breaker's marks (:class:`BreakerBook`). Both come
from records the master signed; what happens to one that is not signed is decided here:

- a job whose signed record is **absent** but whose ``job.json`` says it runs: a job an
  older controller (before records were signed) ran. It is resumed from ``job.json``, as
  that controller would have, so an upgrade loses no running job; the log says so. A user
  cannot make a signed record absent (it is in root's ``cluster/managed/``); root on a
  worker can, and could rewrite the user's request (``--max-cost``) as that user anyway;
- a job whose signed record is there but **not the master's** (forged, or unsigned because
  KMS could not sign when the last master wrote it and it died before signing it again):
  its restarts and cost ledger cannot be known, so it is **failed** with a message saying
  so (its attempt stopped first), never resumed with a ledger someone else wrote;
- breaker marks not signed by the master are none: the breaker counts from this
  controller's own marks (a forged ``cluster/controller.json`` neither trips nor resets it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.jobs.engine.controller_records import (
    ControllerSeal,
    Trust,
    read_job,
    trusted_job,
)
from bootstrap_scripts.jobs.engine.restart_policy import JobState
from bootstrap_scripts.protocol.managed_records import BreakerMarks, ManagedJob
from bootstrap_scripts.protocol.paths import ClusterPaths, ManagedPaths

LOG = logging.getLogger("dl-controller")
#: The states a new controller resumes a job from (a queued one is the queue's).
RESUMABLE = (JobState.RUNNING.value, JobState.RESTARTING.value)


@dataclass(frozen=True)
class Recovered:
    """A job as a new controller finds it: the record to go on from (None: nothing to
    recover, or look again later) and, when it must not be resumed, why."""

    job: ManagedJob | None
    distrust: str = ""
    later: bool = False  # KMS could not be asked: look again, conclude nothing
    signed: bool = False  # the master's record (its ``max_cost_usd`` is the job's cap)


def recovered_job(seal: ControllerSeal, efs: Path, paths: ManagedPaths) -> Recovered:
    """The record a new controller resumes job ``paths`` from (see the module doc)."""
    found = read_job(seal, efs, paths.key)
    if found.trust is Trust.SIGNED:
        return Recovered(trusted_job(found), signed=True)
    if found.trust is Trust.UNCHECKED:
        return Recovered(None, later=True)
    shown = managed.load_job(paths)  # the user's copy: what dl-jobs shows
    if found.trust is Trust.ABSENT:
        if shown is not None and seal.verify is not None and shown.state in RESUMABLE:
            LOG.warning("event=controller-record-missing record=%s job=%s: resumed from "
                        "its job.json (written by a controller that did not sign its "
                        "records)", ClusterPaths(efs).controller_job(paths.key), paths.key)
        return Recovered(shown)
    return Recovered(shown, distrust=(
        f"the job controller's record of this job ({ClusterPaths(efs).controller_job(paths.key)}) "
        f"is not the master's ({found.why}): its restarts and cost ledger cannot be "
        "trusted, so it is not resumed; resubmit it"))


class BreakerBook:
    """The circuit breaker's marks on EFS: read once at start (signed ones only), written
    (signed) whenever a mark is added; expiry alone rewrites nothing (a reader drops marks
    older than the hour itself), so ``kms:Sign`` is called once per mark."""

    def __init__(self, seal: ControllerSeal, efs: Path, me: str) -> None:
        self.seal, self.path, self.me = seal, ClusterPaths(efs).breaker, me
        self.written: tuple[float, ...] | None = None

    def load(self) -> tuple[float, ...]:
        """The marks a predecessor signed (none when unsigned, forged or absent: logged)."""
        found = self.seal.read(self.path, BreakerMarks, "breaker record")
        if found.trust is Trust.UNCHECKED:  # nothing concluded, nothing overwritten
            return ()
        self.written = ()
        if found.trust is Trust.SIGNED and isinstance(found.record, BreakerMarks):
            self.written = found.record.marks
        return self.written

    def save(self, marks: tuple[float, ...]) -> None:
        """Write ``marks`` when one was added since the last write (nothing before
        :meth:`load`: a predecessor's marks are not overwritten unread)."""
        if self.written is None or set(marks) <= set(self.written):
            return
        try:
            self.seal.write(self.path, BreakerMarks(marks=marks, updated_at=time.time(),
                                                    controller=self.me))
        except OSError as exc:  # EFS full or gone for a moment: the next beat tries again
            LOG.error("cannot write %s: %s", self.path, exc)
            return
        self.written = marks

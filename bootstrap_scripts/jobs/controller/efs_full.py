"""Managed jobs' records that EFS had no space for (ENOSPC), kept until it has again.

A controller that cannot write a job's record must neither crash (every other job would
stop being run) nor leave the record saying ``running`` forever. So the job is stopped (its
attempt's cancel file, if even that can be written), failed with "EFS full" in its record,
and that record is kept here and written at every turn of the controller's loop until EFS
takes it. Meanwhile the controller skips the job in its queue.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from bootstrap_scripts.jobs.engine import managed, userfiles
from bootstrap_scripts.jobs.engine.controller_records import ControllerSeal, write_job
from bootstrap_scripts.jobs.engine.restart_policy import JobState
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import ClusterPaths, ManagedPaths

LOG = logging.getLogger("dl-controller")


class UnwrittenRecords:
    """Job records waiting for space on EFS, by job key (``<user>/<id>``)."""

    def __init__(self, efs: Path, me: str, seal: ControllerSeal | None = None) -> None:
        self.efs, self.me = efs, me
        self.seal = seal  # the controller's signed copy is written too (controller_records)
        self.records: dict[str, tuple[ManagedPaths, ManagedJob]] = {}

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.records

    def fail(self, paths: ManagedPaths, job: ManagedJob, exc: OSError) -> None:
        """The job cannot go on: stop its attempt if one runs, fail it with "EFS full",
        and write that record now or as soon as there is space."""
        LOG.error("job %s: EFS full (%s): failing the job", job.job_id, exc)
        if not JobState(job.state).terminal:
            if job.attempt:
                attempt = ClusterPaths(self.efs).job(paths.attempt_key(job.attempt))
                try:
                    with userfiles.as_owner_of(attempt.dir):  # the user's: as the user
                        store.atomic_write(attempt.cancel, "EFS full: the job controller "
                                           "stopped it\n")
                except OSError as again:
                    LOG.error("cannot cancel %s either: %s", attempt.dir, again)
            job = dataclasses.replace(
                job, state=JobState.FAILED.value, controller=self.me, finished_at=time.time(),
                message=f"EFS full: the job controller could not write "
                f"{exc.filename or 'its records'} ({exc.strerror or exc})")
        self.records[paths.key] = (paths, job)
        self.flush()

    def flush(self) -> None:
        """Write the records EFS had no space for; keep those it still has none for."""
        for job_id, (paths, job) in list(self.records.items()):
            try:
                managed.save_job(paths, job)
                if self.seal is not None:
                    write_job(self.seal, self.efs, paths.key, job)
            except OSError as exc:
                LOG.debug("job %s: record still not written: %s", job_id, exc)
                continue
            LOG.info("job %s: its record is written (%s)", job_id, job.message)
            del self.records[job_id]

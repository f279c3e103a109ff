"""Printing a managed job's output: every attempt in turn, live or as it stands.

Used by ``dl-run`` (submit, then follow) and ``dl-jobs logs ID [-f]``. Each attempt's rank
lines come from its node logs with the usual ``[rank address]`` prefix (stdout), its
runner's ``[dl-run]`` messages from ``managed/<id>/attempts/<n>.log`` (stderr), and between
two attempts one line says which restart it was and why. Nothing here changes the job:
interrupting a follower leaves the job running.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bootstrap_scripts.jobs.engine import managed, userfiles
from bootstrap_scripts.jobs.engine.outcomes import say
from bootstrap_scripts.jobs.engine.restart_policy import JobState
from bootstrap_scripts.jobs.engine.watch import LogTailer
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import ClusterPaths, ManagedPaths

POLL_SECONDS = 0.2


class AttemptPrinter:
    """One attempt's node logs and runner messages, printed as they grow."""

    def __init__(self, efs: Path, paths: ManagedPaths, n: int, *, prefix: bool,
                 ranks: frozenset[int] | None) -> None:
        self.n = n
        self.paths = paths
        self.job = ClusterPaths(efs).job(paths.attempt_key(n))
        self.prefix, self.ranks = prefix, ranks
        self.tailer: LogTailer | None = None
        self.runner_offset = 0
        self.runner_partial = b""

    def poll(self, *, final: bool = False) -> None:
        if self.tailer is None:
            try:  # never through a link: root runs this too (an operator's dl-jobs logs)
                text = userfiles.read_owned(self.job.dir, self.job.spec.name).text
            except OSError:  # not there yet, another user's (its --env is theirs), or unsafe
                text = None
            if text:
                try:
                    spec = JobSpec.from_json(text)
                except ProtocolError:  # garbled by its user: looked at again next poll
                    spec = None
                if spec is not None:
                    self.tailer = LogTailer(self.job.nodes, spec, prefix=self.prefix,
                                            ranks=self.ranks)
        if self.tailer is not None:
            self.tailer.poll(final=final)
        self.poll_runner(final=final)

    def poll_runner(self, *, final: bool) -> None:
        data = userfiles.read_from(self.paths.attempt_log(self.n), self.runner_offset)
        if data is None:
            return
        self.runner_offset += len(data)
        *lines, self.runner_partial = (self.runner_partial + data).split(b"\n")
        if final and self.runner_partial:
            lines.append(self.runner_partial)
            self.runner_partial = b""
        if lines:
            sys.stderr.write("".join(line.decode(errors="replace") + "\n" for line in lines))
            sys.stderr.flush()


def restart_line(job: ManagedJob, n: int) -> str:
    """The line between attempt ``n`` and the next: restart k, its kind, the node, why."""
    for k, rec in enumerate(job.restart_log, start=1):
        if rec.attempt == n:
            node = f" node {rec.address} ({rec.instance_id})" if rec.address else ""
            marked = ", marked Unhealthy" if rec.marked_unhealthy else ""
            return (f"---- restart {k} of job {job.job_id} after attempt {n}: {rec.kind}"
                    f"{node}{marked}: {rec.detail} ----")
    return ""


def follow(efs: Path, job_id: str, *, live: bool = True, prefix: bool = True,
           ranks: frozenset[int] | None = None) -> ManagedJob:
    """Print the job's attempts from the first; ``live``: keep following until the job
    ends. Returns the job's record as last seen."""
    paths = managed.find(efs, job_id)
    n = 1
    printer = AttemptPrinter(efs, paths, n, prefix=prefix, ranks=ranks)
    announced, restart_printed = "", False
    while True:
        job = managed.view(paths)
        if job is None:
            raise managed.ManagedError(f"job {job_id} disappeared ({paths.dir})")
        state = JobState(job.state)
        if live and state.value != announced and state in (JobState.QUEUED,
                                                           JobState.RESTARTING):
            say(f"job {job_id} is {state.value}"
                + (f" ({job.last_failure})" if state is JobState.RESTARTING else ""))
        announced = state.value
        printer.poll()
        line = restart_line(job, n)
        if line and not restart_printed:
            printer.poll(final=True)  # the attempt's runner has exited: its logs are whole
            say(line)
            restart_printed = True
        if job.attempt > n:
            printer.poll(final=True)
            n += 1
            printer = AttemptPrinter(efs, paths, n, prefix=prefix, ranks=ranks)
            restart_printed = False
            continue
        if state.terminal or not live:
            printer.poll(final=True)
            return job
        time.sleep(POLL_SECONDS)


def final_message(job: ManagedJob) -> str:
    return (f"job {job.job_id} {job.state} after {job.attempt} attempt(s), {job.restarts} "
            f"restart(s)" + (f": {job.message}" if job.message else ""))

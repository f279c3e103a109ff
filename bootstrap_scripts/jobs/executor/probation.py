"""A job's runner must prove it is alive before this node starts (or joins) the job.

A job found at start-up (a node rebooting, an executor restarting) or an elastic job this
node may join is only started once its runner's heartbeat is seen to change: never start a
job nobody follows any more. Judged by the cluster's one liveness rule
(``protocol.liveness``), on this executor's monotonic clock.
"""

from __future__ import annotations

import time

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.protocol import liveness
from bootstrap_scripts.protocol.liveness import Liveness, Sighting
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import RunnerHeartbeat

#: A job found at start-up is only started if its runner proves alive within this time
#: (its heartbeat changes): a node rebooting must not replay old jobs.
STARTUP_LIVENESS_SECONDS = 3.0


def runner_beat(paths: JobPaths) -> RunnerHeartbeat | None:
    """The runner's latest heartbeat (None while missing or unreadable)."""
    return userfiles.read_record_or_none(paths.runner_heartbeat, RunnerHeartbeat)


class RunnerProbation:
    """Jobs whose runner has to prove it is alive (its heartbeat changes while we watch)
    before this node starts or joins them."""

    ALIVE, WAITING, DEAD = "alive", "waiting", "dead"

    def __init__(self) -> None:
        self.seen: dict[str, Sighting] = {}

    def watching(self, job_id: str) -> bool:
        return job_id in self.seen

    def check(self, job_id: str, paths: JobPaths, give_up_after: float) -> str:
        verdict, sighting = liveness.runner(runner_beat(paths), self.seen.get(job_id),
                                            time.monotonic(), give_up_after)
        if verdict is Liveness.ALIVE:
            self.seen.pop(job_id, None)
            return self.ALIVE
        if verdict.gone:
            self.seen.pop(job_id, None)
            return self.DEAD
        self.seen[job_id] = sighting
        return self.WAITING

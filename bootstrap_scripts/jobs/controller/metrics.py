"""The job controller's metrics: ``JobsRunning`` and ``JobRestarts`` per cluster, as EMF
lines (``bootstrap_scripts.metrics_emf``) in the master's metrics file, which its
CloudWatch agent ships to ``<instance-id>/metrics`` and CloudWatch Logs makes metrics of.

When: at once when the running count changes or the running job was restarted, and at
least every :data:`REPEAT_SECONDS` otherwise, so each of the dashboard's and the alarms'
one-minute periods has a point (``JobsRunning`` is read as a Maximum, ``JobRestarts`` as
a Sum: a repeated 0 adds nothing). The controller runs one job at a time, so
``JobsRunning`` is 0 or 1. ``JobRestarts`` counts the restarts of the running job since
this controller first saw it (a job a previous controller restarted starts from its count
then: a restart is counted once, by the controller that made it).

:func:`decide` is the pure part; :class:`ControllerMetrics` remembers and writes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts import metric_names as names
from bootstrap_scripts import metrics_emf

LOG = logging.getLogger("dl-controller.metrics")

#: The longest pause between two lines (the metrics' period is one minute).
REPEAT_SECONDS = 50.0


@dataclass(frozen=True)
class Seen:
    """What the last line said: the running job (or ""), its restart count then, when."""

    job_id: str = ""
    restarts: int = 0
    at: float = float("-inf")
    written: bool = False


def decide(seen: Seen, *, job_id: str, restarts: int, now: float,
           repeat: float = REPEAT_SECONDS) -> tuple[int, int] | None:
    """(jobs running, new restarts) to write now, None when nothing is due."""
    running = 1 if job_id else 0
    new = max(0, restarts - seen.restarts) if job_id and job_id == seen.job_id else 0
    changed = running != (1 if seen.job_id else 0) or not seen.written
    if changed or new or now - seen.at >= repeat:
        return running, new
    return None


class ControllerMetrics:
    """Call :meth:`observe` from the controller's loop (its heartbeat, ~1 s)."""

    def __init__(self, root: Path, cluster_id: Callable[[], str]) -> None:
        self.path = metrics_emf.metrics_log(root)
        self.cluster_id = cluster_id
        self.seen = Seen()
        self.problem = ""

    def observe(self, *, job_id: str, restarts: int, now: float | None = None) -> bool:
        """Write a line if one is due; True when written. Never raises for a file or an
        unknown cluster: logged once, tried again next time."""
        now = time.monotonic() if now is None else now
        if job_id != self.seen.job_id:  # a new job: its restarts so far are not ours
            self.seen = Seen(job_id, restarts, self.seen.at, self.seen.written
                             and bool(job_id) == bool(self.seen.job_id))
        due = decide(self.seen, job_id=job_id, restarts=restarts, now=now)
        if due is None:
            return False
        cluster = self.cluster_id()
        if not cluster:
            return self._problem("the cluster id is not known yet")
        running, new = due
        line = metrics_emf.render(
            namespace=names.NAMESPACE, dimension_sets=[[names.DIM_CLUSTER]],
            dimensions={names.DIM_CLUSTER: cluster},
            metrics={names.METRIC_JOBS_RUNNING: (running, "Count"),
                     names.METRIC_JOB_RESTARTS: (new, "Count")},
            timestamp_ms=int(time.time() * 1000), properties={"job": job_id})
        try:
            metrics_emf.append(self.path, [line])
        except OSError as exc:
            return self._problem(f"cannot append to {self.path}: {exc}")
        self.seen = Seen(job_id, restarts, now, True)
        self.problem = ""
        return True

    def _problem(self, text: str) -> bool:
        if text != self.problem:
            LOG.warning("job metrics: %s; none written until then", text)
        self.problem = text
        return False

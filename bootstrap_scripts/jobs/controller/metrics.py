"""The job controller's metrics: ``JobsRunning``, ``JobRestarts`` and ``UnhealthyNodes`` per
cluster, the engine's facts (``engine_facts``: ``NodesJoined``, ``MembershipGeneration``,
``JobsQueued``, ``ClusterCostUSD``; per running job ``JobRestarts``, ``JobAttempts``,
``JobCostUSD``), as EMF lines (``bootstrap_scripts.metrics.metrics_emf``) in the master's metrics
file, which its CloudWatch agent ships to ``<instance-id>/metrics`` and CloudWatch Logs
makes metrics of.

When: at once when the running count, the unhealthy count, the membership (its size or
generation) or the queue's length changes or the running job was restarted, and at
least every :data:`REPEAT_SECONDS` otherwise, so each of the dashboard's and the alarms'
one-minute periods has a point (``JobsRunning`` is read as a Maximum, ``JobRestarts`` as
a Sum: a repeated 0 adds nothing). The controller runs one job at a time, so
``JobsRunning`` is 0 or 1. ``JobRestarts`` counts the restarts of the running job since
this controller first saw it (a job a previous controller restarted starts from its count
then: a restart is counted once, by the controller that made it); while a job runs the same
line records it under (``ClusterId``, ``JobId``) too, beside the job's ``JobAttempts`` (a
gauge: 1 + its restarts, read as a Maximum) and ``JobCostUSD``, written at once when a new
attempt starts and once more when the job ends (``final``: its ledger's last figure, or a
job shorter than the repeat would show none). A fact not known yet (no membership, no
price) is left out of the line.

``UnhealthyNodes`` (:func:`unhealthy_nodes`, read as a Maximum by the ``NodeUnhealthy``
alarm) counts root's own evidence, never a user's: the members of the cluster's membership
that this controller marked Unhealthy (``SetInstanceHealth``, ``instance_health``) within
the last hour or that the running job excluded (a failed health gate, a node fault its
executor's lost heartbeat confirmed). A marked node leaves the count when Auto Scaling has
replaced it (it leaves the membership); an excluded one the circuit breaker kept from
being marked stays in it while its job runs, which is when an operator is wanted.

Per job (``ClusterId`` + ``JobId``): ``StepTime`` (the ranks' mean ``step_seconds``),
``SamplesPerSecond`` (the ranks' own ``samples_per_s`` summed) and ``Loss`` (their mean
``loss``), from the progress files the controller already reads for hangs
(``hangs.HangWatch``: the user's files, read as the user); a line at most every
:data:`PROGRESS_SECONDS` and only when some rank's step moved, so a hung job's graph
stops rather than repeating its last figure, and one more when an attempt ends (``final``:
its last figures at once; a rank's first report has no step time or rate yet, so an
attempt shorter than :data:`PROGRESS_SECONDS` would otherwise show only its first loss).
What no rank reports is left out.

:func:`decide` and :func:`progress_metrics` are the pure part; :class:`ControllerMetrics`
remembers and writes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from bootstrap_scripts.jobs.controller.engine_facts import Facts
from bootstrap_scripts.metrics import metric_names as names
from bootstrap_scripts.metrics import metrics_emf
from bootstrap_scripts.protocol.records import RankProgress

LOG = logging.getLogger("dl-controller.metrics")

#: The longest pause between two lines (the metrics' period is one minute).
REPEAT_SECONDS = 50.0
#: The shortest pause between two per-job progress lines.
PROGRESS_SECONDS = 15.0


@dataclass(frozen=True)
class Seen:
    """What the last line said: the running job (or ""), its restart count then, when, the
    unhealthy nodes it counted and the engine's facts that make a line due (``changes``)."""

    job_id: str = ""
    restarts: int = 0
    at: float = float("-inf")
    written: bool = False
    unhealthy: int = 0
    changes: tuple[int | None, ...] = ()


def decide(seen: Seen, *, job_id: str, restarts: int, now: float, unhealthy: int = 0,
           changes: tuple[int | None, ...] = (),
           repeat: float = REPEAT_SECONDS) -> tuple[int, int, int] | None:
    """(jobs running, new restarts, unhealthy nodes) to write now, None when nothing is
    due: at once when one of them or the engine's ``changes`` (``Facts.changes``) changed,
    else every ``repeat`` seconds."""
    running = 1 if job_id else 0
    new = max(0, restarts - seen.restarts) if job_id and job_id == seen.job_id else 0
    changed = running != (1 if seen.job_id else 0) or not seen.written or \
        unhealthy != seen.unhealthy or changes != seen.changes
    if changed or new or now - seen.at >= repeat:
        return running, new, unhealthy
    return None


def unhealthy_nodes(members: Iterable[str], marked: Iterable[str],
                    excluded: Iterable[str]) -> int:
    """How many of the membership's instances (``members``) were marked Unhealthy or
    excluded by the running job: a node already replaced (gone from the membership) is
    no longer unhealthy, and an id that is not a member counts for nothing."""
    flagged = {i for i in (*marked, *excluded) if i}
    return len(flagged.intersection(members))


def cluster_line(*, cluster: str, job_id: str, running: int, new: int, unhealthy: int,
                 facts: Facts, timestamp_ms: int) -> str:
    """The cluster's line: its metrics under ``ClusterId``; while a job runs, its restarts
    under ``ClusterId`` and ``ClusterId`` + ``JobId`` (one directive, two dimension sets)
    and its attempts and cost under ``ClusterId`` + ``JobId``."""
    metrics: dict[str, tuple[float, str]] = {
        names.METRIC_JOBS_RUNNING: (running, "Count"),
        names.METRIC_JOB_RESTARTS: (new, "Count"),
        names.METRIC_UNHEALTHY_NODES: (unhealthy, "Count")}
    if facts.nodes:
        metrics[names.METRIC_NODES_JOINED] = (facts.nodes, "Count")
        metrics[names.METRIC_MEMBERSHIP_GENERATION] = (facts.generation, "None")
    if facts.queued is not None:
        metrics[names.METRIC_JOBS_QUEUED] = (facts.queued, "Count")
    if facts.cluster_usd is not None:
        metrics[names.METRIC_CLUSTER_COST] = (facts.cluster_usd, "None")
    directives: list[metrics_emf.Directive] = [([[names.DIM_CLUSTER]], list(metrics))]
    dimensions = {names.DIM_CLUSTER: cluster}
    if job_id:  # JobRestarts under both sets (one directive), the job's own under its set
        dimensions[names.DIM_JOB] = job_id
        both = [[names.DIM_CLUSTER], [names.DIM_CLUSTER, names.DIM_JOB]]
        directives = [([[names.DIM_CLUSTER]],
                       [n for n in metrics if n != names.METRIC_JOB_RESTARTS]),
                      (both, [names.METRIC_JOB_RESTARTS])]
        per_job = []
        if facts.job_attempts:
            metrics[names.METRIC_JOB_ATTEMPTS] = (facts.job_attempts, "Count")
            per_job.append(names.METRIC_JOB_ATTEMPTS)
        if facts.job_usd is not None:
            metrics[names.METRIC_JOB_COST] = (facts.job_usd, "None")
            per_job.append(names.METRIC_JOB_COST)
        if per_job:
            directives.append((both[1:], per_job))
    return metrics_emf.render(namespace=names.NAMESPACE, dimensions=dimensions,
                              metrics=metrics, directives=directives,
                              timestamp_ms=timestamp_ms, properties={"job": job_id})


def progress_metrics(records: Mapping[int, RankProgress]) -> dict[str, tuple[float, str]]:
    """A job's metrics from its ranks' latest progress (non-finite figures ignored)."""
    def known(attr: str) -> list[float]:
        return [float(v) for r in records.values()
                if isinstance(v := getattr(r, attr), int | float) and math.isfinite(v)]

    out: dict[str, tuple[float, str]] = {}
    if steps := known("step_seconds"):
        out[names.METRIC_STEP_TIME] = (fmean(steps), "Seconds")
    if rates := known("samples_per_s"):
        out[names.METRIC_SAMPLES_PER_SECOND] = (sum(rates), "Count/Second")
    if losses := known("loss"):
        out[names.METRIC_LOSS] = (fmean(losses), "None")
    return out


class ControllerMetrics:
    """Call :meth:`observe` from the controller's loop (its heartbeat, ~1 s)."""

    def __init__(self, root: Path, cluster_id: Callable[[], str]) -> None:
        self.path = metrics_emf.metrics_log(root)
        self.cluster_id = cluster_id
        self.seen = Seen()
        self.problem = ""
        #: the (rank, step) pairs of the last progress line, and when it was written
        self.progress_steps: tuple[tuple[int, int], ...] = ()
        self.progress_at = float("-inf")
        self.progress_job = ""  # whose steps those are: a new job starts afresh

    def observe(self, *, job_id: str, restarts: int, unhealthy: int = 0,
                facts: Facts | None = None, now: float | None = None,
                final: bool = False) -> bool:
        """Write a line if one is due (``final``: the job ended, a line now); True when
        written. ``unhealthy``: the :func:`unhealthy_nodes` count now; ``facts``:
        ``EngineFacts.now()``. Never raises for a file or an unknown cluster: logged once,
        tried again next time."""
        now = time.monotonic() if now is None else now
        facts = facts or Facts()
        if job_id != self.seen.job_id:  # a new job: its restarts so far are not ours
            self.seen = Seen(job_id, restarts, self.seen.at, self.seen.written
                             and bool(job_id) == bool(self.seen.job_id), self.seen.unhealthy,
                             self.seen.changes)
        due = decide(self.seen, job_id=job_id, restarts=restarts, now=now,
                     unhealthy=unhealthy, changes=facts.changes,
                     repeat=0.0 if final else REPEAT_SECONDS)
        if due is None:
            return False
        cluster = self.cluster_id()
        if not cluster:
            return self._problem("the cluster id is not known yet")
        running, new, bad = due
        line = cluster_line(cluster=cluster, job_id=job_id, running=running, new=new,
                            unhealthy=bad, facts=facts, timestamp_ms=int(time.time() * 1000))
        try:
            metrics_emf.append(self.path, [line])
        except OSError as exc:
            return self._problem(f"cannot append to {self.path}: {exc}")
        self.seen = Seen(job_id, restarts, now, True, bad, facts.changes)
        self.problem = ""
        return True

    def observe_progress(self, job_id: str, records: Mapping[int, RankProgress], *,
                         now: float | None = None, final: bool = False) -> bool:
        """The running job's progress line, if some rank's step moved since the last one
        and :data:`PROGRESS_SECONDS` passed (``final``: the attempt ended, no wait); True
        when written."""
        now = time.monotonic() if now is None else now
        if job_id != self.progress_job:  # its first steps may equal the previous job's
            self.progress_steps, self.progress_at, self.progress_job = (), float("-inf"), job_id
        steps = tuple(sorted((rank, r.step) for rank, r in records.items()))
        if not job_id or not steps or steps == self.progress_steps or \
                (now - self.progress_at < PROGRESS_SECONDS and not final):
            return False
        metrics = progress_metrics(records)
        cluster = self.cluster_id() if metrics else ""
        if not cluster:
            return False
        line = metrics_emf.render(
            namespace=names.NAMESPACE, dimension_sets=[[names.DIM_CLUSTER, names.DIM_JOB]],
            dimensions={names.DIM_CLUSTER: cluster, names.DIM_JOB: job_id}, metrics=metrics,
            timestamp_ms=int(time.time() * 1000),
            properties={"ranks": len(records), "step": max(s for _r, s in steps)})
        try:
            metrics_emf.append(self.path, [line])
        except OSError as exc:
            return self._problem(f"cannot append to {self.path}: {exc}")
        self.progress_steps, self.progress_at = steps, now
        return True

    def _problem(self, text: str) -> bool:
        if text != self.problem:
            LOG.warning("job metrics: %s; none written until then", text)
        self.problem = text
        return False

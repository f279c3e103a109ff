"""The job engine's own facts, as the controller's metric lines carry them (``metrics.py``):
nodes joined and the membership's generation, jobs queued, and the cost so far of the
cluster's managed jobs and of the running one.

Where each comes from, all of it root's own records (never a user's file):

- ``NodesJoined`` / ``MembershipGeneration``: the membership the master's agent applied
  (``<root>/opt/deeplearning/membership.json``), read at every look (one small local file):
  a join, a replacement or a scale-in shows at once.
- ``JobsQueued``: the managed jobs whose request is there and whose record says ``queued``
  (or has none yet), as ``dl-jobs`` lists them;
- ``ClusterCostUSD``: the sum of every managed job's cost ledger (``usage``, ``ops/cost``)
  from the controller's signed copy of its record (``cluster/managed/<user>/<id>.json``,
  which its user cannot rewrite; ``job.json`` only for a job without one), those in
  ``managed/`` and those the retention moved to ``archive/managed/``; ``JobCostUSD``: the
  running job's ledger, from the controller's own record in memory (fresh at every line).
  How a node is priced is ``ops/cost``'s: its seconds in the job's attempts x the hourly
  rate recorded for it when the attempt started
  (On-Demand list price, Spot price in effect, Capacity Block or Reservation rate); the
  controller does not count a node it could not price (``dl-jobs`` says which and why), so
  a figure with such a node is a lower bound. Idle nodes between jobs are in no ledger.

The records of the jobs are read at most every :data:`SCAN_SECONDS` (the metrics' period is
one minute) and when the running job changes (one started or ended: the line written then
counts the ended job's final ledger and the queue without it), and a finished job's
ledger, which no longer changes, is read once per controller and remembered (by its
directory: an archived job is read once more where it moved to).

:func:`priced_usd` and :func:`tally` are the pure part; :class:`EngineFacts` reads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from bootstrap_scripts.jobs.engine import managed, user_dirs
from bootstrap_scripts.jobs.engine.controller_records import ControllerSeal, Trust
from bootstrap_scripts.jobs.engine.restart_policy import JobState
from bootstrap_scripts.ops import cost
from bootstrap_scripts.protocol.managed_records import AttemptUsage, ManagedJob
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import (
    MANAGED_DIR,
    USER_NAME_RE,
    ClusterPaths,
    ManagedPaths,
    NodePaths,
)

#: The longest pause between two scans of the jobs' records.
SCAN_SECONDS = 50.0
#: The states whose ledger no longer changes.
TERMINAL = frozenset(s.value for s in JobState if s.terminal)


@dataclass(frozen=True)
class Facts:
    """What one metric line says of the engine; ``None`` (or 0 nodes) where it is not known
    yet (no membership, no scan): such a metric is left out of the line."""

    nodes: int = 0
    generation: int = 0
    queued: int | None = None
    cluster_usd: float | None = None
    job_attempts: int = 0
    job_usd: float | None = None

    @property
    def changes(self) -> tuple[int | None, ...]:
        """What makes a line due at once when it changes (the costs move all the time): a
        node joined or left, a job queued or started, the running job's next attempt."""
        return self.nodes, self.generation, self.queued, self.job_attempts


def listing(directory: Path) -> list[str]:
    """The sub-directories of ``directory`` (no link, no dot-name), sorted; [] if none."""
    try:
        return sorted(e.name for e in os.scandir(directory)
                      if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
    except OSError:
        return []


def priced_usd(usage: Iterable[AttemptUsage], now: float) -> Decimal:
    """A job's ledger at ``now`` over the nodes that have a price (``ops/cost.node_cost``
    per node and attempt; a running attempt counts up to ``now``)."""
    total = Decimal(0)
    for attempt in usage:
        end = attempt.ended_at if attempt.ended_at is not None else now
        span = max(0.0, end - attempt.started_at)
        for node in attempt.nodes:
            total += cost.node_cost(span, node) or Decimal(0)
    return total


def tally(jobs: Mapping[str, tuple[str, Decimal]], running: ManagedJob | None,
          now: float) -> tuple[int, Decimal]:
    """(jobs queued, USD so far) of the scanned ``jobs`` (``key -> (state, ledger)``), the
    running job's entry replaced by its fresh record (scanned as it started, its record may
    still say queued: it is not)."""
    mine = f"{running.user}/{running.job_id}" if running is not None else None
    queued = sum(1 for key, (state, _usd) in jobs.items() if state == JobState.QUEUED.value
                 and key != mine)
    total = sum((usd for key, (_s, usd) in jobs.items() if key != mine), Decimal(0))
    if running is not None:
        total += priced_usd(running.usage, now)
    return queued, total


def _job_key(key: str, directory: Path) -> str:
    return f"{directory.parent.name}/{directory.name}" if key.startswith("archive/") else key


class EngineFacts:
    """Call :meth:`now` for every metric line (the controller's heartbeat, ~1 s)."""

    def __init__(self, root: Path, efs: Path, *, scan_seconds: float = SCAN_SECONDS,
                 seal: ControllerSeal | None = None) -> None:
        self.membership = NodePaths(root).membership
        #: a job's ledger is the controller's signed copy where there is one (a user may
        #: rewrite their job.json, not the copy): ``controller_records``
        self.seal, self.cluster = seal, ClusterPaths(efs)
        self.dirs = (ClusterPaths(efs).managed_dir,
                     ClusterPaths(efs).archive_dir / MANAGED_DIR)
        self.scan_seconds = scan_seconds
        self.scanned_at = float("-inf")
        self.running_id = ""  # the running job at the last scan ("" none)
        #: every job seen by the last scan: ``key -> (state, ledger at the scan)``; the key
        #: is ``<user>/<id>`` in ``managed/``, ``archive/<user>/<name>`` for an archived one
        self.jobs: dict[str, tuple[str, Decimal]] = {}
        #: the finished jobs' entries, read once (their ledger no longer changes)
        self.finished: dict[str, tuple[str, Decimal]] = {}

    def now(self, running: ManagedJob | None = None, *, at: float | None = None,
            clock: float | None = None) -> Facts:
        """The facts now; ``running``: the controller's record of the job it runs.
        ``at``: wall-clock time for the ledgers, ``clock``: monotonic time for the scans."""
        at = time.time() if at is None else at
        clock = time.monotonic() if clock is None else clock
        try:
            m = Membership.load(self.membership)
            nodes, generation = len(m.nodes), m.generation
        except (OSError, ValueError):
            nodes, generation = 0, 0
        running_id = running.job_id if running is not None else ""
        if clock - self.scanned_at >= self.scan_seconds or running_id != self.running_id:
            self.scan(at)
            self.scanned_at, self.running_id = clock, running_id
        queued, usd = tally(self.jobs, running, at)
        return Facts(nodes=nodes, generation=generation, queued=queued,
                     cluster_usd=round(float(usd), 4),
                     job_attempts=running.attempt if running is not None else 0,
                     job_usd=round(float(priced_usd(running.usage, at)), 4)
                     if running is not None else None)

    def scan(self, at: float) -> None:
        """Read the jobs' records (a finished one only the first time it is seen)."""
        jobs: dict[str, tuple[str, Decimal]] = {}
        finished: dict[str, tuple[str, Decimal]] = {}
        for archived, top in enumerate(self.dirs):
            # the users' own directories; the archive's are root's (the controller made them)
            users = (list(user_dirs.user_dirs(top)) if not archived else
                     [(u, top / u) for u in listing(top) if USER_NAME_RE.fullmatch(u)])
            for user, directory in users:
                for name in listing(directory):
                    key = f"archive/{user}/{name}" if archived else f"{user}/{name}"
                    self.tally_one(jobs, finished, key, directory / name, at)
        self.jobs, self.finished = jobs, finished

    def tally_one(self, jobs: dict[str, tuple[str, Decimal]],
                  finished: dict[str, tuple[str, Decimal]], key: str, directory: Path,
                  at: float) -> None:
        """Add one job's (state, ledger) under ``key`` (read once when it is finished)."""
        entry = self.finished.get(key)
        if entry is None:
            try:
                job = managed.view(ManagedPaths(directory))
            except (OSError, ValueError):  # gone, or not a job's directory
                job = None
            if job is None:
                return
            job = self.signed_copy(key, directory) or job
            entry = (job.state, priced_usd(job.usage, at))
        if entry[0] in TERMINAL:
            finished[key] = entry
        jobs[key] = entry

    def signed_copy(self, key: str, directory: Path) -> ManagedJob | None:
        """The controller's signed record of the job (None: none, or not the master's)."""
        if self.seal is None:
            return None
        job_key = _job_key(key, directory)
        try:
            path = (self.cluster.archived_controller_job(job_key) if key.startswith("archive/")
                    else self.cluster.controller_job(job_key))
        except ValueError:
            return None
        found = self.seal.read(path, ManagedJob, "job record")
        return found.record if isinstance(found.record, ManagedJob) and \
            found.trust is Trust.SIGNED else None

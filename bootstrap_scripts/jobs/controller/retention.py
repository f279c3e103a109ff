"""Finished jobs' records leave ``managed/`` and ``jobs/`` after their retention.

Every job leaves a directory on EFS (its spec, logs, exits, result; a managed job also its
request and record). Kept forever, ``dl-jobs`` lists grow without end and each scan of the
job directories (the executors', the controller's) gets slower. So the job controller moves
the records of jobs that finished more than ``--retention-days`` ago (default 7) to
``archive/managed/<user>/<id>/`` and ``archive/jobs/<user>/<id>/``
(``ClusterPaths.archive_dir``): out of
the way, still there for whoever needs a log; deleting them is the operator's choice.

What counts as finished: a managed job in a terminal state (its ``finished_at``); a job
directory with its runner's ``done`` marker (its time), unless it is an attempt of a
managed job that is still kept. A job that never finished is never archived.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from bootstrap_scripts.jobs.engine import managed, user_dirs
from bootstrap_scripts.jobs.engine.controller_records import (
    ControllerSeal,
    Trust,
    read_job,
    trusted_job,
)
from bootstrap_scripts.jobs.engine.restart_policy import JobState
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import JOBS_DIR, MANAGED_DIR, ClusterPaths, ManagedPaths

LOG = logging.getLogger("dl-controller")
DEFAULT_RETENTION_DAYS = 7.0
DAY = 86400.0


def expired(finished_at: float | None, *, now: float, days: float) -> bool:
    """A job that finished at ``finished_at`` is past a retention of ``days``."""
    return bool(finished_at) and days > 0 and now - float(finished_at) > days * DAY


def _move(src: Path, dest_dir: Path) -> Path | None:
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / src.name
    if dest.exists():  # archived before (a name reused): keep both
        dest = dest_dir / f"{src.name}.{int(time.time())}"
    try:
        os.rename(src, dest)
    except OSError as exc:
        LOG.error("cannot archive %s: %s", src, exc)
        return None
    return dest


def _controller_record(seal: ControllerSeal | None, efs: Path, paths: ManagedPaths
                       ) -> ManagedJob | None:
    """The job's record to judge it by: the controller's signed copy, ``job.json`` only for
    a job without one (a user's rewrite of their ``job.json`` archives nothing early, nor
    keeps anything); None (kept) when the copy is not the master's or cannot be checked."""
    if seal is None:
        return managed.load_job(paths)
    found = read_job(seal, efs, paths.key)
    if found.trust is Trust.ABSENT:
        return managed.load_job(paths)
    return trusted_job(found)


def _move_record(efs: Path, paths: ManagedPaths, dest: Path) -> None:
    """The controller's copy goes with the job (``<dest>.controller.json``, root's archive):
    a later job of the same id starts without it, and the cost it records stays counted."""
    src = ClusterPaths(efs).controller_job(paths.key)
    try:
        os.rename(src, dest.with_name(dest.name + ".controller.json"))
    except FileNotFoundError:
        pass
    except OSError as exc:
        LOG.error("cannot archive %s: %s", src, exc)


def archive_finished(efs: Path, *, days: float, now: float | None = None,
                     seal: ControllerSeal | None = None) -> list[str]:
    """Move every finished job past ``days`` to the archive; returns what moved
    (``managed/<user>/<id>``, ``jobs/<user>/<id>``). ``days`` <= 0: keep everything."""
    if days <= 0:
        return []
    now = time.time() if now is None else now
    cluster = ClusterPaths(efs)
    moved: list[str] = []
    kept: set[str] = set()
    for paths in managed.all_paths(efs):
        job = _controller_record(seal, efs, paths)
        done = job is not None and JobState(job.state).terminal
        dest = _move(paths.dir, cluster.archive_dir / MANAGED_DIR / paths.user) if done and \
            expired(job.finished_at or job.updated_at, now=now, days=days) else None
        if dest is not None:
            _move_record(efs, paths, dest)
            moved.append(f"{MANAGED_DIR}/{paths.key}")
            continue
        kept.add(paths.key)
    for user, directory in user_dirs.user_dirs(cluster.jobs_dir):
        try:
            names = sorted(e.name for e in os.scandir(directory)
                           if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if f"{user}/{name.rpartition('.')[0]}" in kept:
                continue  # an attempt of a managed job still listed: its logs stay with it
            jpaths = cluster.job(name, user)
            try:
                finished = jpaths.done.lstat().st_mtime  # the user's marker: no link followed
            except OSError:
                continue  # not finished (or not a job)
            if expired(finished, now=now, days=days) and _move(
                    jpaths.dir, cluster.archive_dir / JOBS_DIR / user):
                moved.append(f"{JOBS_DIR}/{jpaths.key}")
    if moved:
        LOG.info("archived %d finished job record(s) older than %g day(s): %s", len(moved),
                 days, ", ".join(moved))
    return moved

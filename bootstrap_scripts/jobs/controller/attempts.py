"""One attempt of a managed job: today's single-run engine, started by the controller.

Attempt ``n`` of job ``J`` is the ordinary job ``jobs/J.n/``, run by ``python -m
bootstrap_scripts.jobs.cli.dl_run --unmanaged --request -`` with the job's run request (as
``J.n``) on its standard input: the engine's one front door, as ``dl-run --unmanaged``.
The controller starts that runner as the user who submitted the job (the owner of
``request.json``), so the attempt's ``spec.json`` is theirs and the executors run every
share as them, exactly as when the user runs ``dl-run``.
The attempt's ``result.json`` and share exits then tell the controller what happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from bootstrap_scripts import progress
from bootstrap_scripts.data.checkpoint_plan import join_url
from bootstrap_scripts.jobs.controller import node_heartbeats
from bootstrap_scripts.jobs.engine import hang_rules, image_pull, userfiles
from bootstrap_scripts.jobs.engine.classify import Failure, as_input, classify
from bootstrap_scripts.jobs.engine.reachability import Executors, read_heartbeat
from bootstrap_scripts.jobs.engine.summary import INPUT_STEPS
from bootstrap_scripts.node.procgroup import alive
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.managed_records import ManagedRequest
from bootstrap_scripts.protocol.nnodes import NodeRange, NodeRangeError, node_range, parse_nnodes
from bootstrap_scripts.protocol.paths import SHARE_STARTED_SUFFIX, ClusterPaths, JobPaths
from bootstrap_scripts.protocol.records import (
    JobResult,
    RunnerHeartbeat,
    ShareExit,
    ShareStarted,
)
from bootstrap_scripts.protocol.run_request import RunRequest
from bootstrap_scripts.tensorboard_log import DIR_ENV as TENSORBOARD_ENV

LOG = logging.getLogger("dl-controller")
#: This package's parent directory: the attempt runner must import it whatever the user's env.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])


class AttemptError(Exception):
    """The attempt cannot be started (e.g. another user's job and no root); names why."""


def checkpoint_dir(efs: Path, job_id: str, user: str) -> str:
    """``DL_CHECKPOINT_DIR`` of a managed job: ``<EFS>/checkpoints/<user>/<job-id>``, the
    same for every attempt, so a restarted attempt finds what the previous one saved, in
    its submitter's own directory (no other user can plant a checkpoint there)."""
    return str(ClusterPaths(efs).user_checkpoints(user) / job_id)


def restart_env(efs: Path, job_id: str, restart_count: int, user: str) -> dict[str, str]:
    """The variables every rank of an attempt sees: ``DL_CHECKPOINT_DIR`` always,
    ``DL_RESTART_COUNT`` (0 on the first attempt), and ``DL_RESUME=1`` on restarts only."""
    env = {"DL_CHECKPOINT_DIR": checkpoint_dir(efs, job_id, user),
           "DL_RESTART_COUNT": str(restart_count)}
    if restart_count:
        env["DL_RESUME"] = "1"
    return env


def checkpoint_url(base: str, job_id: str, user: str) -> str:
    """Where a managed job's checkpoint directory is mirrored: ``<base><user>/<job-id>/``
    (``base``: the cluster's ``s3://<bucket>/checkpoints/<cluster-id>/``, "" for none), the
    prefix the job role lets that user's jobs write."""
    return join_url(base, user, job_id) if base else ""


def attempt_request(request: ManagedRequest, *, attempt_id: str, efs: Path,
                    restart_count: int, user: str, checkpoints_url: str = "") -> RunRequest:
    """What attempt ``attempt_id`` runs: the job's run request under the attempt's id, with
    this package importable by the ranks (as their own ``dl-run`` would have it) and the
    restart variables and ``DL_PROGRESS_DIR`` last: they win over the user's own ``--env``
    of the same name, and mpirun forwards them (``-x``) like any ``--env``. With a hang
    timeout, torch's watchdog settings too (``hang_rules.watchdog_env``), unless the user
    set them. With ``checkpoints_url`` (the cluster's), the checkpoint directory is mirrored
    there (``engine.checkpoints``)."""
    run = request.run
    env = dict(run.env)
    env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"]
                                          if env.get("PYTHONPATH") else "")
    env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    restart = restart_env(efs, request.job_id, restart_count, user)
    jpaths = ClusterPaths(efs).job(attempt_id, user)
    restart[progress.DIR_ENV] = str(jpaths.progress_dir)  # where ranks declare progress
    # TensorBoard event files: the job's own directory, one for every attempt (ManagedPaths)
    restart[TENSORBOARD_ENV] = str(ClusterPaths(efs).managed(request.job_id, user).tensorboard_dir)
    env.update(restart)
    watchdog = hang_rules.watchdog_env(run.hang_timeout, str(jpaths.flight_dir / "rank_"))
    for key, value in watchdog.items():  # the user's own --env of the same name wins
        env.setdefault(key, value)
    forward = tuple(dict.fromkeys((*run.forward, *restart, *watchdog)))
    # An elastic attempt admits a late node only once the controller's gate passed it
    # (``rejoin.py``).
    return dataclasses.replace(run, job_id=attempt_id, env=env, forward=forward,
                               join_admission=run.elastic,
                               checkpoint_url=checkpoint_url(checkpoints_url,
                                                             request.job_id, user))


def runner_argv(*, root: str, efs: Path, membership: Path | None) -> list[str]:
    """The attempt runner's command line: ``dl-run --unmanaged`` reading its run request
    on its standard input (see :func:`spawn`)."""
    argv = [sys.executable, "-m", "bootstrap_scripts.jobs.cli.dl_run", "--unmanaged",
            "--request", "-", "--root", root, "--mount-point", str(efs)]
    if membership is not None:
        argv += ["--membership", str(membership)]
    return argv


def runner_env(request: RunRequest, *, as_root: bool = False) -> dict[str, str]:
    """The attempt runner's own environment: the ranks' (this package importable). A runner
    of root's own job (``as_root``) signs its spec with the master's key (``root_jobs``), so
    it also keeps the controller's own AWS settings (on EC2 there are none but the region:
    the SDK finds the instance role itself); a user's runner never sees them."""
    env = {k: v for k, v in request.env.items() if k in ("PATH", "PYTHONPATH", "HOME", "USER",
                                                          "LOGNAME", "PYTHONUNBUFFERED")}
    if as_root:
        env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def owner(path: Path) -> tuple[int, int]:
    """(uid, gid) of a managed job's ``request.json`` (its submitter), or of its directory
    when ``path`` is one, taken from ``fstat`` of what was opened without following links:
    a request that is a link, or not its directory owner's, is refused (UnsafeUserFile)."""
    if path.name == "request.json":
        owned = userfiles.read_owned(path.parent, path.name)
        return owned.uid, owned.gid
    return userfiles.owner_of_dir(path)


def spawn(argv: list[str], request: RunRequest, log: Path, *, uid: int, gid: int
          ) -> subprocess.Popen:
    """Start the attempt runner as ``uid``/``gid`` (no supplementary groups) in a session of
    its own; its ``[dl-run]`` messages go to ``log``, the ranks' lines (which are in the node
    logs already) nowhere. A controller that is not root runs only its own user's jobs."""
    as_user: dict = {}
    if uid != os.geteuid():
        if os.geteuid() != 0:
            raise AttemptError(f"the job controller runs as uid {os.geteuid()} and cannot run "
                               f"a job submitted by uid {uid} (run it as root, as its "
                               f"systemd unit does)")
        as_user = {"user": uid, "group": gid, "extra_groups": []}
    try:
        with userfiles.as_user(uid, gid):  # the user's directory: the user's rights, no link
            log.parent.mkdir(parents=True, exist_ok=True)
            fd = userfiles.open_append(log)
    except OSError as exc:
        raise AttemptError(f"cannot open the attempt's log {log} as uid {uid}: {exc}") from None
    env = runner_env(request, as_root=not as_user and os.geteuid() == 0)
    with os.fdopen(fd, "ab") as out:
        proc = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=out, start_new_session=True,
                                **as_user)
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(request.to_json().encode())
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    return proc


#: A runner beats every second; this long without a beat, it is gone.
RUNNER_SILENT_SECONDS = 5.0


def runner_alive(paths: JobPaths, silent: float = RUNNER_SILENT_SECONDS) -> bool:
    """Is the attempt's runner still following it (not done, its heartbeat recent, its
    process there)? How a restarted controller finds an attempt its predecessor started:
    the runner is not its child, but it beats on EFS, and it runs on this machine (the
    master: same clock, same processes; a new master sees a silent heartbeat)."""
    if userfiles.exists(paths.done):  # the user's files: never through a link
        return False
    hb = userfiles.read_record_or_none(paths.runner_heartbeat, RunnerHeartbeat)
    return hb is not None and time.time() - hb.time < silent and alive(hb.pid)


def exits(paths: JobPaths) -> dict[int, ShareExit]:
    return {rec.rank: rec for _stem, rec in userfiles.scan(paths.nodes, ShareExit,
                                                           suffix=".exit")}


def outcome(paths: JobPaths, runner_code: int | None) -> Failure | None:
    """How the attempt ended: the one classifier (:func:`classify.classify`) on the
    attempt's result and exits, as its runner's summary saw them."""
    result = userfiles.read_record_or_none(paths.result, JobResult)
    if result is None and runner_code is not None and runner_code > 0:
        # the job never started: did its image's pull fail first (the cluster's fault)?
        pull = JobPaths(paths.dir.with_name(paths.dir.name + image_pull.PULL_SUFFIX))
        pulled = userfiles.read_record_or_none(pull.result, JobResult)
        if pulled is not None and pulled.status == "failed":
            return image_pull.pull_failure(classify(pulled, exits(pull)), pulled, exits(pull))
        # or its input step (restore, staging)?
        for suffix, what in INPUT_STEPS:
            step = JobPaths(paths.dir.with_name(paths.dir.name + suffix))
            done = userfiles.read_record_or_none(step.result, JobResult)
            if done is not None and done.status == "failed":
                return as_input(classify(done, exits(step)), what)
    return classify(result, exits(paths), runner_code=runner_code)


def shares_started_at(paths: JobPaths) -> float | None:
    """When the last of the attempt's shares started, once every share of its spec has;
    None before."""
    try:  # the user's file: never through a link (``userfiles``); theirs to garble too
        spec = JobSpec.from_json(userfiles.read_owned(paths.dir, paths.spec.name).text)
    except (OSError, ProtocolError):
        return None
    started = {rec.rank: rec for _s, rec in userfiles.scan(
        paths.nodes, ShareStarted, suffix=SHARE_STARTED_SUFFIX)}
    if any(s.rank not in started for s in spec.shares):
        return None
    return max((started[s.rank].started_at for s in spec.shares), default=None)


def attempt_nnodes(paths: JobPaths, run: RunRequest, count: int) -> NodeRange:
    """torchrun's ``--nnodes`` of a running attempt: the range its launcher computed and
    published in the attempt's spec (``JobSpec.nnodes``). Without ``--nnodes`` an elastic
    job's MAX depends on the node count, so only the attempt's own value is sure. A spec
    written before that field: the launcher's rule (``protocol.nnodes.node_range``) on
    the request and the spec's share count; no readable spec yet: on ``count``."""
    try:  # the user's file: never through a link (``userfiles``)
        spec = JobSpec.from_json(userfiles.read_owned(paths.dir, paths.spec.name).text)
    except (OSError, ProtocolError):
        spec = None
    if spec is not None and spec.nnodes:
        return parse_nnodes(spec.nnodes)
    size = len(spec.shares) if spec is not None else count
    try:
        return node_range(run.nnodes, max(1, size), elastic=run.elastic)
    except NodeRangeError:  # refused by the runner: no attempt runs with it
        return node_range("", max(1, size), elastic=run.elastic)


#: How long the controller waits for the shares of an attempt whose runner died to stop.
ABANDONED_STOP_TIMEOUT = 60.0


def stop_abandoned(paths: JobPaths, efs: Path, *, tick: object = None,
                   timeout: float = ABANDONED_STOP_TIMEOUT, root: Path | None = None) -> bool:
    """An attempt whose runner ended without a result (killed, crashed) may still have
    running shares: the runner stops them only on its way out, and the executors only once
    its heartbeat has been silent for the job's heartbeat timeout. Stop them now through the
    attempt's cancel file, as the runner would have, and wait, so that the next attempt
    never runs beside them (two attempts of one job writing one checkpoint). True when
    nothing of the attempt runs any more. ``root``: as for :func:`wait_stopped`."""
    if userfiles.exists(paths.result) or not paths.dir.is_dir():
        return True  # summarized by its runner (its shares settled), or never published
    try:
        with userfiles.as_owner_of(paths.dir):  # the user's directory: as the user
            store.atomic_write(paths.cancel, "abandoned: the attempt's runner ended "
                               "without a result\n")
    except OSError as exc:
        LOG.error("cannot cancel %s: %s", paths.dir, exc)
    stopped = wait_stopped(paths, efs, timeout=timeout, tick=tick, root=root)
    if not stopped:
        LOG.error("attempt %s still has running shares after %.0f s", paths.job_id, timeout)
    return stopped


def wait_stopped(paths: JobPaths, efs: Path, *, timeout: float, heartbeat_timeout: float = 10.0,
                 tick: object = None, root: Path | None = None) -> bool:
    """Wait until every started share of an attempt has exited, or its node's executor is
    gone (nothing runs it any more): the next attempt must not meet the previous one's
    processes (ports, GPUs). ``tick()`` is called while waiting (the controller's heartbeat).
    True when everything stopped within ``timeout``.

    ``root``: the controller's node root; its executors' heartbeats then count only when
    their nodes signed them (``node_heartbeats``): a "stopped" heartbeat root on another
    worker forged would otherwise let the next attempt start beside shares still running."""
    deadline = time.monotonic() + timeout
    executors = Executors(efs, heartbeat_timeout, read=(
        read_heartbeat if root is None else node_heartbeats.reader(root)))
    while True:
        started = {rec.rank: rec for _s, rec in userfiles.scan(
            paths.nodes, ShareStarted, suffix=SHARE_STARTED_SUFFIX)}
        done = exits(paths)
        gone = executors.gone(r.address for r in started.values() if r.rank not in done)
        running = [r for r in started.values() if r.rank not in done
                   and r.address not in gone]
        if not running or time.monotonic() > deadline:
            return not running
        if callable(tick):
            tick()
        time.sleep(0.5)

"""``dl-run`` for a managed job: check, submit to the job controller, follow (or detach).

Everything that can be wrong with the command line or the cluster is checked here, before
the job is queued, with today's exit statuses: 2 for a bad option or launcher plan, 3 for a
node whose executor is unreachable. The request then carries the job's
:class:`~bootstrap_scripts.protocol.run_request.RunRequest` (the command, the working directory,
the variables ``dl-run`` forwards to the ranks: PATH, the venv, ...; the launcher's and the
runner's options), so that each attempt runs as if the user had started ``dl-run
--unmanaged`` themselves.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import signal
import sys
import time

from bootstrap_scripts.jobs.cli.follow import final_message, follow
from bootstrap_scripts.jobs.cli.request_args import (
    load_context,
    max_cost_from_args,
    request_from_args,
)
from bootstrap_scripts.jobs.cli.workdir import unpack, workdir_of
from bootstrap_scripts.jobs.engine import managed, root_jobs
from bootstrap_scripts.jobs.engine import run as engine
from bootstrap_scripts.jobs.engine.command_check import submit_problem
from bootstrap_scripts.jobs.engine.outcomes import EXIT_FAILED, EXIT_USAGE, RunError, say
from bootstrap_scripts.jobs.engine.reachability import check_reachable
from bootstrap_scripts.jobs.engine.restart_policy import (
    DEFAULT_MAX_CODE_RESTARTS,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_REPLACE_TIMEOUT,
    JobState,
    Policy,
)
from bootstrap_scripts.protocol.jobs import new_job_id
from bootstrap_scripts.protocol.managed_records import ManagedRequest
from bootstrap_scripts.protocol.paths import ClusterPaths, validate_job_id


def build_request(args: argparse.Namespace, command: list[str]
                  ) -> tuple[ManagedRequest, ClusterPaths]:
    ctx = load_context(args)
    job_id = validate_job_id(args.job_id) if args.job_id else new_job_id(
        args.name or args.launcher)
    cluster = ClusterPaths(ctx.efs)
    if args.workdir_archive is not None:  # the job runs in its own unpacked directory
        if args.workdir_archive != "-":
            raise RunError("--workdir-archive reads standard input: give -", EXIT_USAGE)
        if args.cwd:
            raise RunError("--workdir-archive runs the job in its own directory: no --cwd",
                           EXIT_USAGE)
        args.cwd = str(workdir_of(cluster.managed(job_id)))
    run = request_from_args(args, command, job_id)
    max_cost = max_cost_from_args(args)
    # The first attempt's plan, to fail now (exit 2) on what would fail every attempt.
    engine.prepare(dataclasses.replace(run, job_id=f"{job_id}.1"), ctx.membership, ctx.efs)
    policy = Policy(
        max_restarts=DEFAULT_MAX_RESTARTS if args.max_restarts is None else args.max_restarts,
        min_nodes=args.min_nodes or 0,
        max_code_restarts=DEFAULT_MAX_CODE_RESTARTS if args.max_code_restarts is None
        else args.max_code_restarts,
        replace_timeout=DEFAULT_REPLACE_TIMEOUT if args.replace_timeout is None
        else args.replace_timeout)
    # Workers stopped while idle: the job's size is the cluster's before the stop (the
    # controller scales the workers back to it and the job waits for them).
    idle = managed.idle_stop(cluster.efs)
    size = len(ctx.membership.nodes)
    args.idle_note = ""
    if idle is not None and idle.stopped_at is not None:
        size = max(size, 1 + idle.desired_before)
        args.idle_note = (f"{managed.idle_text(idle, _clock)}: the job controller starts them "
                          f"now and the job waits for its {size} node(s)")
        say(args.idle_note)
    if policy.min_nodes > size:
        raise RunError(f"--min-nodes {policy.min_nodes} is more than the "
                       f"{size} node(s) of the cluster", EXIT_USAGE)
    check_reachable(ctx.efs, [n.address for n in ctx.membership.nodes],
                    timeout=args.heartbeat_timeout, reach_timeout=args.reach_timeout)
    request = ManagedRequest(
        job_id=job_id, run=run, submitted_at=time.time(),
        user=getpass.getuser(), world_size=size,
        max_restarts=policy.max_restarts, min_nodes=policy.min_nodes,
        max_code_restarts=policy.max_code_restarts, replace_timeout=policy.replace_timeout,
        max_cost_usd=max_cost)
    return request, cluster


def submit_and_follow(args: argparse.Namespace, command: list[str]) -> int:
    """Submit; with ``--detach`` print the id, else follow until the job ends (0 succeeded,
    1 failed or cancelled) or the user detaches with Ctrl-C (0, the job keeps running)."""
    if args.json and not args.detach:
        raise RunError("--json goes with --detach (it prints the job id)", EXIT_USAGE)
    if not command:
        raise RunError("no command given: put the training command after the options",
                       EXIT_USAGE)
    request, cluster = build_request(args, command)
    why = submit_problem(request.run.command, request.run.env, request.run.cwd)
    if why:  # as the submitting user, on the master: no node could start it either
        raise RunError(f"{why} (looked for on the master as {getpass.getuser()}, with the "
                       f"job's PATH): nothing was submitted", EXIT_USAGE)
    status = managed.controller_status(cluster.efs)
    if status.heartbeat is None:
        raise RunError(f"{status.text}: this cluster has no job controller; run the job "
                       f"without one with dl-run --unmanaged", EXIT_USAGE)
    def unpack_workdir(paths) -> None:
        count = unpack(sys.stdin.buffer, workdir_of(paths))
        say(f"unpacked {count} file(s) into {workdir_of(paths)}")

    try:
        managed.submit(cluster.efs, request,
                       unpack_workdir if args.workdir_archive is not None else None,
                       root_jobs.signer(args.root))
    except managed.ManagedError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None
    if not status.alive:
        say(f"warning: {status.text}; the job waits in the queue until it is back")
    if args.detach:
        note = {"note": args.idle_note} if args.idle_note else {}
        print(json.dumps({"job_id": request.job_id, **note}) if args.json else request.job_id,
              flush=True)
        return 0
    say(f"job {request.job_id} submitted (dl-jobs show {request.job_id}); Ctrl-C detaches, "
        f"the job keeps running")
    old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        job = follow(cluster.efs, request.job_id, prefix=not args.no_prefix)
    except KeyboardInterrupt:
        say(f"detached: job {request.job_id} keeps running; follow it again with "
            f"'dl-jobs logs {request.job_id} -f', stop it with 'dl-jobs cancel "
            f"{request.job_id}'")
        return 0
    except managed.ManagedError as exc:
        raise RunError(str(exc), EXIT_FAILED) from None
    finally:
        signal.signal(signal.SIGTERM, old)
    say(final_message(job))
    return 0 if job.state == JobState.SUCCEEDED.value else EXIT_FAILED


def _clock(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt

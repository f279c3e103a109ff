"""The job's context and run request from ``dl-run``'s parsed options.

Shared by ``dl-run --unmanaged`` (``dl_run.py``) and a managed submission (``submit.py``):
apart from both, so neither imports the other.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.containers import allow, resolve
from bootstrap_scripts.containers.reference import BadReference
from bootstrap_scripts.containers.reference import parse as parse_image
from bootstrap_scripts.data import checksums
from bootstrap_scripts.jobs.cli.env_args import given_env
from bootstrap_scripts.jobs.engine.outcomes import EXIT_USAGE, RunError
from bootstrap_scripts.ops.cost import parse_usd, plain
from bootstrap_scripts.protocol.data_source import DataSourceError, check_data_options
from bootstrap_scripts.protocol.membership import Membership, MembershipError
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.run_request import FORWARDED_ENV, RunRequest


@dataclass
class Context:
    membership: Membership
    efs: Path


def load_context(args: argparse.Namespace) -> Context:
    path = Path(args.membership) if args.membership else NodePaths(args.root).membership
    try:
        m = Membership.load(path)
    except FileNotFoundError:
        raise RunError(f"no membership at {path}: is the node agent running, and is --root "
                       f"({args.root}) right?", EXIT_USAGE) from None
    except (OSError, MembershipError) as exc:
        raise RunError(f"cannot read membership {path}: {exc}", EXIT_USAGE) from None
    efs = Path(args.mount_point or m.efs_mount)
    return Context(m, efs)


def given(args: argparse.Namespace) -> dict[str, str]:
    """The variables the job was given by ``--env-file`` and ``--env`` (``env_args``)."""
    return given_env(args.env, getattr(args, "env_file", None) or [])


def job_env(args: argparse.Namespace, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment: the forwarded variables, then ``extra`` (default:
    :func:`given`; values from a file or from this environment stay off command lines)."""
    env = {k: os.environ[k] for k in (*FORWARDED_ENV, *args.forward) if k in os.environ}
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the log (and the runner) as they are printed
    env.update(given(args) if extra is None else extra)
    return env


def data_checksums(args: argparse.Namespace) -> str:
    """The job's ``--data-checksums``: as given, else (with ``--data``) the cluster's
    default installed on this node (the stack's ``dataChecksums``,
    ``data.checksums.node_default``: ``warn`` on a node installed without it). A job
    without ``--data`` stages nothing and keeps the request's default."""
    if args.data_checksums is not None:
        return args.data_checksums
    return checksums.node_default(args.root) if args.data else checksums.WARN


def pinned_image(image: str, root: str) -> str:
    """``--image`` as the request carries it: from a repository the stack allows (the
    node's copy of ``allowedImages``), else RunError naming the repository and the setting;
    a tag resolved to its digest now, as the submitting user (``containers.resolve``), else
    RunError naming the tag. A malformed reference is left to the request's own check,
    which names it. The allow rule comes first: a refused registry is never asked."""
    if not image:
        return image
    try:
        ref = parse_image(image)
    except BadReference:
        return image
    try:
        allow.check(allow.node_entries(root), ref)
    except allow.ImageNotAllowed as exc:
        raise RunError(str(exc), EXIT_USAGE) from None
    if ref.pinned:
        return image
    try:
        return str(resolve.resolve(ref))
    except resolve.ResolveError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None


def request_from_args(args: argparse.Namespace, command: list[str], job_id: str
                      ) -> RunRequest:
    """The run request of these options: what ``--unmanaged`` runs and what a managed job's
    request carries to every attempt."""
    if not command:
        raise RunError("no command given: put the training command after the options",
                       EXIT_USAGE)
    try:
        check_data_options(args.data, args.data_shard, args.data_checksums)
    except DataSourceError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None
    image = pinned_image(getattr(args, "image", ""), getattr(args, "root", "/"))
    extra = given(args)
    return RunRequest(
        job_id=job_id, command=tuple(command), launcher=args.launcher, env=job_env(args, extra),
        forward=tuple(args.forward) + tuple(extra),
        cwd=os.path.abspath(args.cwd or os.getcwd()), python=args.python,
        nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
        torchrun_max_restarts=args.torchrun_max_restarts, rdzv_port=args.rdzv_port,
        elastic=args.elastic, rdzv_last_call=args.rdzv_last_call,
        mpi_if_include=args.mpi_if_include, mpi_if_exclude=args.mpi_if_exclude,
        nccl_socket_ifname=args.nccl_socket_ifname, mpi_rsh_agent=args.mpi_rsh_agent,
        mpi_args=tuple(args.mpi_arg), mpirun=args.mpirun, horovodrun=args.horovodrun,
        tf_mode=args.tf_mode, tf_port=args.tf_port, mxnet_launch=args.mxnet_launch,
        grace=args.grace, fail_grace=args.fail_grace, heartbeat_timeout=args.heartbeat_timeout,
        reach_timeout=args.reach_timeout, start_timeout=args.start_timeout,
        orphan_timeout=args.orphan_timeout, prefix=not args.no_prefix, data=args.data,
        data_shard=args.data_shard, data_checksums=data_checksums(args),
        resume_from=args.resume_from,
        mounts=tuple(getattr(args, "mount", ())),
        hang_timeout=getattr(args, "hang_timeout", 0.0), image=image)


def max_cost_from_args(args: argparse.Namespace) -> str:
    """``--max-cost`` as the managed request carries it (an exact decimal, "" = no cap);
    RunError naming the value when it is not an amount the controller can keep."""
    if args.max_cost is None:
        return ""
    try:
        return plain(parse_usd(args.max_cost))
    except ValueError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None

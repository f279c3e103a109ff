"""``dl-run``: start a training job on every node, stream its output, return one exit status.

    dl-run [options] -- <command ...>
    dl-run -- python -m bootstrap_scripts.examples.train_digits --epochs 20

By default the job is *managed*: ``dl-run`` submits it to the master's job controller
(``controller.py``), which runs it (and restarts it after node faults), and follows its
output (``follow.py``); Ctrl-C detaches and the job keeps running. ``--unmanaged`` runs the
job from this process, as described below (the controller runs each attempt that way).

``--unmanaged`` turns the options and the command into a
:class:`~bootstrap_scripts.protocol.run_request.RunRequest` (or reads one, ``--request FILE``/``-``:
how the job controller and the health gate hand theirs over) and runs it on the nodes of
the membership the node agent wrote (``<root>/opt/deeplearning/``) through the engine's
front door, :func:`bootstrap_scripts.jobs.engine.run.run`: the launch plan, the executors'
reachability, the job spec on EFS, every node's log with a ``[node-rank address]`` prefix,
and one exit status from the verdict (0 only if every share exited 0). Ctrl-C / SIGTERM
writes a cancel marker; the executors stop their process groups within seconds.
See docs/runner.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bootstrap_scripts.data import checksums
from bootstrap_scripts.jobs.cli import env_args
from bootstrap_scripts.jobs.cli.request_args import load_context, request_from_args
from bootstrap_scripts.jobs.engine import launchers as ln
from bootstrap_scripts.jobs.engine import managed, root_jobs
from bootstrap_scripts.jobs.engine import run as engine
from bootstrap_scripts.jobs.engine.outcomes import EXIT_SIGINT, EXIT_USAGE, RunError, say
from bootstrap_scripts.jobs.engine.restart_policy import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_REPLACE_TIMEOUT,
)
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import new_job_id
from bootstrap_scripts.protocol.nnodes import ELASTIC_MAX_NODES
from bootstrap_scripts.protocol.paths import MEMBERSHIP_FILE, validate_job_id
from bootstrap_scripts.protocol.run_request import RunRequest

#: A run request's defaults are dl-run's: the request is the one definition of a job's options.
DEFAULTS = RunRequest(job_id="job", command=("true",))
#: Options of managed jobs only (the controller's business, not an attempt's).
MANAGED_ONLY = ("--detach", "--json", "--max-restarts", "--min-nodes", "--max-code-restarts",
                "--replace-timeout", "--workdir-archive", "--max-cost", "--hang-timeout")


# -- arguments -----------------------------------------------------------------------------


class ArgumentContainer(Protocol):
    """An argparse parser or argument group."""

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action: ...

    def add_argument_group(self, title: str) -> ArgumentContainer: ...


@dataclass
class OptionSet:
    """A parser (or one of its groups) that remembers which options take a value, so that
    :func:`split_command` can tell an option's value from the start of the command."""

    container: ArgumentContainer
    value_options: set[str] = field(default_factory=set)

    def add(self, *names: str, **kwargs: Any) -> None:
        action = self.container.add_argument(*names, **kwargs)
        if action.nargs is None:  # one value ("store", "append"); flags have nargs=0
            self.value_options.update(action.option_strings)

    def group(self, title: str) -> OptionSet:
        return OptionSet(self.container.add_argument_group(title), self.value_options)


def build_cli() -> tuple[argparse.ArgumentParser, frozenset[str]]:
    """The parser, and the option strings that take a value."""
    parser = argparse.ArgumentParser(
        prog="dl-run", usage="dl-run [options] -- <command ...>", allow_abbrev=False,
        description="Start a training job on every node of the cluster and watch it.")
    p = OptionSet(parser)
    m = p.group("managed job (the job controller runs it; see docs/runner.md)")
    m.add("--unmanaged", action="store_true",
          help="run the job from this process, without the controller: no restarts, the "
          "job stops when dl-run does")
    m.add("--detach", action="store_true", help="submit, print the job id and exit")
    m.add("--json", action="store_true", help="with --detach: print {\"job_id\": ...}")
    m.add("--max-restarts", type=int, default=None,
          help=f"restarts of the whole job after node faults (default: {DEFAULT_MAX_RESTARTS})")
    m.add("--min-nodes", type=int, default=None,
          help="restart on the surviving nodes if at least this many (default: all)")
    m.add("--max-code-restarts", type=int, default=None,
          help="restarts after the command itself failed on healthy nodes (default: 0)")
    m.add("--replace-timeout", type=float, default=None,
          help=f"seconds a restart waits for a replaced node (default: "
          f"{DEFAULT_REPLACE_TIMEOUT:.0f})")
    m.add("--max-cost", default=None, metavar="USD",
          help="stop the job, as a cancel does (SIGTERM, then the grace period to "
          "checkpoint), once its nodes' cost reaches USD (their seconds x their On-Demand, "
          "Spot or reserved price); it ends 'budget' and is not restarted (default: no cap)")
    m.add("--hang-timeout", type=float, default=DEFAULTS.hang_timeout, metavar="SECONDS",
          help="no progress on any rank (bootstrap_scripts.progress.report) for this long: "
          "dump every rank's stack, then restart the job as a hang (default: 0, off; "
          "docs/runner.md)")
    m.add("--workdir-archive", default=None, metavar="-",
          help="unpack the tar.gz on standard input into the job's own directory on EFS "
          "(managed/<id>/workdir) and run there (dlc submit --workdir)")
    p.add("--launcher", default=DEFAULTS.launcher, choices=ln.LAUNCHERS,
          help="how ranks are started (default: torchrun)")
    p.add("--dry-run", action="store_true", help="print per-node commands, run nothing")
    p.add("--request", default="", metavar="FILE",
          help="with --unmanaged: run this run request (JSON; '-': standard input) instead "
          "of the job options given here (how the job controller starts an attempt)")
    p.add("--name", default="", help="job name, prefix of the job id (default: launcher)")
    p.add("--job-id", default="", help="explicit job id (default: generated)")
    p.add("--root", default=os.environ.get("DL_ROOT", "/"),
          help="node root prefix where the agent wrote its files (default: /)")
    p.add("--membership", default="", help=f"membership to use (default: <root>/{MEMBERSHIP_FILE})")
    p.add("--mount-point", default="", help="EFS mount point (default: the membership's)")
    p.add("--env", action="append", default=[], metavar="KEY[=VALUE]",
          help="extra environment for every rank (repeatable). KEY alone takes the value "
          "from dl-run's own environment (as docker run -e KEY): on no command line, the "
          "way for a secret. A KEY=VALUE given here is taken off dl-run's command line as "
          "it starts (it runs itself again with the value in its environment), but every "
          "user of the node can read it there until then, and your shell's history keeps "
          "it. The values are stored in the job's files on EFS, readable by you and by root "
          "only (mode 0600), and never printed by dl-jobs; they are not a secret store "
          "beyond that (root, and your own jobs, see them): prefer a credentials file or an "
          "IAM role for real secrets")
    p.add("--env-file", action="append", default=[], metavar="FILE",
          help="KEY=VALUE lines for every rank's environment (repeatable; blank lines and # "
          "comments skipped, KEY alone as --env KEY; --env wins), read as you: the values "
          "never appear on a command line")
    p.add("--forward", action="append", default=[], metavar="VAR",
          help="forward this variable of the runner's environment (repeatable)")
    p.add("--cwd", default="", help="working directory of every rank (default: current)")
    p.add("--image", default="", metavar="REPOSITORY[:TAG][@sha256:DIGEST]",
          help="run every rank in this container image, as you, with the node's network, "
          "GPUs, EFS and the job's directories (rootless podman through dl-container; the "
          "torchrun launcher only; docs/containers.md); a tag is resolved to its digest "
          "here, once, and the image is pulled on every node before any rank starts")
    p.add("--python", default="", help="the job's interpreter: runs torchrun, tf and mxnet, "
          "and replaces a leading 'python'/'python3' of the command on every node "
          "(default: this one if it has torch, else python3)")
    g = p.group("data in S3 (README, \"Data in S3\")")
    g.add("--data", default="", metavar="s3://BUCKET/PREFIX[:/LOCAL/DIR]",
          help="before the job starts, copy this S3 prefix to every node's fastest local "
          "disk (instance-store NVMe, else the root volume) or to /LOCAL/DIR, as the job's "
          "user; objects already there with the same size and ETag are skipped; the ranks "
          "find it in $DL_DATA_DIR")
    g.add("--data-shard", action="store_true",
          help="with --data: each node copies only its share of the objects (every Nth "
          "object in key order, N the node count)")
    g.add("--data-checksums", default=None, choices=checksums.MODES,
          help="with --data: 'required' fails the staging, before the job starts, on the "
          "first object whose bytes botocore cannot check against S3's checksum (CRC64NVME "
          "or CRC32C without awscrt, a multipart upload's composite checksum, none in S3), "
          "naming it, and fetches large objects in one request so that theirs is checked; "
          "'warn' stages those and counts them (default: the cluster's dataChecksums "
          f"setting, installed on the node; {DEFAULTS.data_checksums} on a node without it)")
    g.add("--mount", action="append", default=[], metavar="s3://BUCKET/PREFIX:/DIR",
          help="before the job starts, mount this S3 prefix read-only at /DIR (a "
          "directory you own) on every node with Mountpoint for Amazon S3, as your user, "
          "with the job's own credentials; unmounted when the job ends. Reads stream from "
          "S3 (no copy first): see README \"Data in S3\" for when --data is better "
          "(repeatable, at most 8)")
    g.add("--resume-from", default="", metavar="s3://BUCKET/PREFIX",
          help="a managed job: before its first attempt, resume from the newest complete "
          "checkpoint under this S3 prefix (an old cluster's mirror, e.g. "
          "s3://<checkpoint bucket>/checkpoints/<old-cluster-id>/<user>/<job-id>/) when it "
          "is newer than the job's own; see README \"Data in S3\"")
    g = p.group("torchrun")
    g.add("--nnodes", default="", help="N or MIN:MAX (default: the node count); with "
          "--elastic, the nodes beyond MAX are spares that take a lost node's place at "
          "the next restart (docs/elastic-training.md \"Spare nodes\")")
    g.add("--nproc-per-node", type=int, default=0,
          help="processes per node (default: its GPU count, 1 on CPU nodes)")
    g.add("--torchrun-max-restarts", type=int, default=0,
          help="torchrun's own in-place restarts of the workers (default: 0)")
    g.add("--rdzv-port", type=int, default=DEFAULTS.rdzv_port,
          help="rendezvous port (default: %(default)s)")
    g.add("--elastic", action="store_true",
          help="elastic job: nodes that join the cluster while it runs join the job, "
          "draining nodes leave it, the others re-rendezvous and continue "
          f"(implies --nnodes 1:MAX, MAX {ELASTIC_MAX_NODES} or the node count if larger, and "
          f"--torchrun-max-restarts {ln.ELASTIC_MAX_RESTARTS} unless given; see "
          "docs/elastic-training.md)")
    g.add("--rdzv-last-call", type=float, default=0.0,
          help="seconds a rendezvous waits for more nodes once MIN are there "
          f"(default: torchrun's 30, elastic jobs {ln.ELASTIC_LAST_CALL:g})")
    g = p.group("mpi / horovod")
    g.add("--mpi-if-include", default="", help="only these interfaces for MPI traffic "
          "(replaces --mpi-if-exclude; the loopback emulator uses 'lo')")
    g.add("--mpi-if-exclude", default=DEFAULTS.mpi_if_exclude,
          help="interfaces MPI must not use (default: %(default)s)")
    g.add("--nccl-socket-ifname", default=DEFAULTS.nccl_socket_ifname,
          help="NCCL_SOCKET_IFNAME (default: %(default)s)")
    g.add("--mpi-rsh-agent", default="", help="ssh command for mpirun, e.g. 'ssh -F cfg'")
    g.add("--mpi-arg", action="append", default=[], help="extra mpirun argument")
    g.add("--mpirun", default=DEFAULTS.mpirun)
    g.add("--horovodrun", default=DEFAULTS.horovodrun)
    g = p.group("tensorflow / mxnet")
    g.add("--tf-mode", default=DEFAULTS.tf_mode, choices=("worker", "ps"))
    g.add("--tf-port", type=int, default=DEFAULTS.tf_port)
    g.add("--mxnet-launch", default=DEFAULTS.mxnet_launch, help="path of MXNet's tools/launch.py")
    g = p.group("supervision")
    g.add("--grace", type=float, default=DEFAULTS.grace,
          help="seconds between SIGTERM and SIGKILL when stopping (default: %(default)g)")
    g.add("--fail-grace", type=float, default=DEFAULTS.fail_grace,
          help="after one node fails, seconds the others get to exit by themselves "
          "before they are stopped (default: %(default)g)")
    g.add("--heartbeat-timeout", type=float, default=DEFAULTS.heartbeat_timeout,
          help="an executor heartbeat older than this is a lost node (default: %(default)g)")
    g.add("--reach-timeout", type=float, default=DEFAULTS.reach_timeout,
          help="how long to wait for a missing executor before failing (default: %(default)g)")
    g.add("--start-timeout", type=float, default=DEFAULTS.start_timeout,
          help="seconds for every node to acknowledge its share (default: %(default)g)")
    g.add("--orphan-timeout", type=float, default=DEFAULTS.orphan_timeout,
          help="executors stop a share whose runner is silent this long (default: %(default)g)")
    g.add("--no-prefix", action="store_true", help="print rank output without prefix")
    return parser, frozenset(p.value_options)


def build_parser() -> argparse.ArgumentParser:
    return build_cli()[0]


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Options before ``--``, the command after it. Without ``--`` the first token that is
    not an option (or an option's value) starts the command, as with torchrun itself."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    takes_value = build_cli()[1]
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("-"):
            return argv[:i], argv[i:]
        i += 2 if tok in takes_value else 1
    return argv, []


def read_request(source: str) -> RunRequest:
    """A run request from a file, or from standard input (``-``)."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as exc:
        raise RunError(f"cannot read the run request {source}: {exc}", EXIT_USAGE) from None
    return RunRequest.from_json(text, source=source if source != "-" else "run request")


# -- main ----------------------------------------------------------------------------------


def run(argv: list[str]) -> int:
    opts_argv, command = split_command(argv)
    args = build_parser().parse_args(opts_argv)
    if not args.unmanaged and not args.dry_run:
        from bootstrap_scripts.jobs.cli.submit import submit_and_follow

        return submit_and_follow(args, command)
    if args.unmanaged:
        given = [o for o in MANAGED_ONLY if getattr(args, o.lstrip("-").replace("-", "_"))
                 not in (None, False)]
        if given:
            raise RunError(f"{', '.join(given)} only apply to managed jobs, not with "
                           f"--unmanaged (torchrun's own restarts: --torchrun-max-restarts)",
                           EXIT_USAGE)
    ctx = load_context(args)
    if args.request:
        request = read_request(args.request)
    else:
        job_id = validate_job_id(args.job_id) if args.job_id else new_job_id(
            args.name or args.launcher)
        request = request_from_args(args, command, job_id)
        idle = managed.idle_stop(ctx.efs)
        if args.unmanaged and idle is not None and idle.stopped_at is not None:
            say(f"note: this cluster's workers are stopped (idle stop): an --unmanaged job "
                f"runs on the {len(ctx.membership.nodes)} node(s) there are; run it managed "
                f"(without --unmanaged) to bring the {idle.desired_before} worker(s) back, "
                f"or 'dl-scale --workers N'")
    if args.dry_run:
        plan, _paths, commands = engine.prepare(request, ctx.membership, ctx.efs)
        engine.announce(request, plan, ctx.membership)
        sys.stdout.write(commands)
        return 0
    return engine.run(request, ctx.membership, ctx.efs,
                      root_jobs.signer(args.root)).exit_code


def hide_env_values(argv: list[str]) -> None:
    """When ``argv`` (this process's command line) holds ``--env KEY=VALUE``, run dl-run
    again at once, in this process, with ``--env KEY`` instead and the values in its
    environment (``env_args``): never returns then."""
    options, command = split_command(argv)
    hidden = env_args.hide_values(options)
    if hidden is None:
        return
    options, values = hidden
    cut = len(sys.orig_argv) - len(argv)
    if cut < 1 or sys.orig_argv[cut:] != argv:  # not started as a program: nothing to hide
        return
    interpreter = sys.orig_argv[:cut]  # python [-I] -m <module>
    os.execve(sys.executable, [*interpreter, *options, "--", *command],
              {**os.environ, env_args.CARRIER: json.dumps(values)})


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        hide_env_values(sys.argv[1:])
    env_args.carried()  # out of this environment before anything starts a process
    try:
        return run(list(sys.argv[1:] if argv is None else argv))
    except RunError as exc:
        say(f"error: {exc}")
        return exc.code
    except ProtocolError as exc:  # a bad --job-id, a malformed spec
        say(f"error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:  # before the job was published: nothing to stop
        say("interrupted before the job started")
        return EXIT_SIGINT
    except ValueError as exc:  # a restart policy out of range
        say(f"error: {exc}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

"""The ``dlc`` command line (click): options, output, exit codes.

Every command reads the cluster through AWS APIs; see docs/dlc.md. Tables are for people,
``--json`` for scripts. Exit codes (:mod:`dlc.errors`): 0 ok, 1 failed, 2 usage, 3 not
found, 4 AWS error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from dlc import cloudwatch, deploy, errors, session, wake
from dlc import jobs as jobs_mod
from dlc import status as status_mod
from dlc.target import DEFAULT_STACK, EMULATOR_ENV, Target, resolve

#: Where ``dlc logs`` reads a job's output (``--source``).
LOG_SOURCES = ("auto", "efs", "cloudwatch")


#: The widest ``dlc jobs`` table (columns).
JOBS_WIDTH = 120


def out() -> Console:
    """stdout for people; piped output is not cut to 80 columns."""
    return Console(highlight=False, soft_wrap=True,
                   width=None if sys.stdout.isatty() else 200)


def emit_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def target_of(ctx: click.Context) -> Target:
    """The target named by the group's options (resolved on first use)."""
    obj = ctx.find_root().obj
    if "target" not in obj:
        obj["target"] = resolve(**obj["options"])
    return obj["target"]


def remote_of(ctx: click.Context):
    return jobs_mod.master_remote(target_of(ctx))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--stack", default=None, metavar="NAME",
              help=f"the cluster's CloudFormation stack (default {DEFAULT_STACK})")
@click.option("--region", default=None, help="AWS region (default: profile / environment)")
@click.option("--profile", default=None, help="AWS named profile")
@click.option("--emulator", default=None, metavar="STATE", envvar=EMULATOR_ENV,
              help=f"state.json of a cluster 'make demo ARGS=--keep' left running "
                   f"(or ${EMULATOR_ENV})")
@click.pass_context
def cli(ctx: click.Context, stack, region, profile, emulator) -> None:
    """Run a deep-learning cluster from your laptop: deploy it, see it, submit and follow
    jobs, scale it, open a shell. Talks to AWS APIs only (docs/dlc.md)."""
    ctx.obj = {"options": {"stack": stack, "region": region, "profile": profile,
                           "emulator": emulator}}


@cli.command()
@click.option("-c", "--context", "contexts", multiple=True, metavar="KEY=VALUE",
              help="stack setting (docs/settings.md); repeatable")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="follow nodes booting and the membership forming after the deploy")
@click.option("--timeout", type=click.IntRange(min=1), default=1800, show_default=True,
              help="seconds for the whole deploy and wait")
@click.pass_context
def up(ctx, contexts, wait, timeout) -> None:
    """Deploy (or update) the stack with the pinned CDK CLI and follow it coming up."""
    deploy.up(target_of(ctx), list(contexts), click.echo, wait=wait, timeout=timeout)


@cli.command()
@click.option("--delete-data", is_flag=True,
              help="also delete the EFS file system and the checkpoint bucket the stack created "
                   "(RETAINed otherwise), and schedule the bucket's KMS key for deletion")
@click.option("--timeout", type=click.IntRange(min=1), default=1800, show_default=True)
@click.pass_context
def down(ctx, delete_data, timeout) -> None:
    """Destroy the stack; the shared file system and checkpoint bucket are kept unless
    --delete-data."""
    deploy.down(target_of(ctx), click.echo, delete_data=delete_data, timeout=timeout)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def status(ctx, as_json) -> None:
    """Stack, nodes (health, generation, heartbeat), membership, jobs, hourly cost."""
    st = status_mod.gather(target_of(ctx))
    if as_json:
        emit_json(st)
    else:
        status_mod.render(out(), st)


@cli.command()
@click.option("--launcher", default=None, help="torchrun (default), mpi, horovod, tf, mxnet, each")
@click.option("--max-restarts", type=click.IntRange(min=0), default=None,
              help="restarts after a node fault (the controller's default: 3)")
@click.option("--min-nodes", type=click.IntRange(min=1), default=None,
              help="fewest nodes to run on (default: all)")
@click.option("--name", default=None, help="a name for the job")
@click.option("--max-cost", default=None, metavar="USD",
              help="stop the job (as a cancel does: SIGTERM, then its grace period to "
                   "checkpoint) once its nodes' cost reaches USD; it ends 'budget', never "
                   "restarted (default: no cap)")
@click.option("--as", "as_user", default=None, metavar="USER",
              help="the cluster user the job runs as (default: your IAM identity's dl-user "
                   "tag, else its name, docs/dlc.md); never root. IAM decides: an operator "
                   "may run only their own user's document")
@click.option("--workdir", default=None, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="ship this local directory (minus .gitignore/.dlcignore) to the job's "
                   "own directory on the cluster's EFS and run COMMAND there")
@click.option("--cwd", default=None, metavar="DIR",
              help="run COMMAND in DIR, a directory already on the cluster")
@click.option("--json", "as_json", is_flag=True, help='print {"job_id": ...}')
@click.option("--resume-from", default=None, metavar="s3://BUCKET/PREFIX",
              help="start from the newest complete checkpoint under this S3 prefix (e.g. an "
                   "old cluster's mirror: s3://<CheckpointBucketName>/checkpoints/"
                   "<cluster-id>/<user>/<job-id>/); docs/data.md")
@click.option("--mount", "mounts", multiple=True, metavar="s3://BUCKET/PREFIX:/DIR",
              help="mount this S3 prefix read-only at DIR (a directory of the job's user) "
                   "on every node with Mountpoint for Amazon S3 while the job runs; "
                   "repeatable; docs/data.md")
@click.option("--data", default=None, metavar="s3://BUCKET/PREFIX[:/DIR]",
              help="before the job starts, copy this S3 prefix to every node's fastest "
                   "local disk (or DIR); the ranks find it in $DL_DATA_DIR; docs/data.md")
@click.option("--data-shard", is_flag=True,
              help="with --data: each node copies only its share of the objects")
@click.option("--data-checksums", default=None, metavar="warn|required",
              help="with --data: 'required' fails the staging on an object whose bytes "
                   "cannot be checked against S3's checksum; 'warn' stages and counts it "
                   "(default: the cluster's dataChecksums setting, warn unless set)")
@click.option("--hang-timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="no progress on any rank for this long: dump the stacks and restart "
                   "(default: 0, off; docs/runner.md \"Hangs and stragglers\")")
@click.option("--elastic", is_flag=True,
              help="an elastic job: it trains on through a lost node and grows back when "
                   "the replacement joins (docs/elastic-training.md)")
@click.option("--nnodes", default=None, metavar="N|MIN:MAX",
              help="torchrun's node count (default: every node); with --elastic, the nodes "
                   "beyond MAX wait as spares that take a lost node's place "
                   "(docs/elastic-training.md \"Spare nodes\")")
@click.option("--image", default=None, metavar="REPOSITORY[:TAG][@sha256:DIGEST]",
              help="run every rank in this container image, as the job's user, from a "
                   "repository the cluster's allowedImages lists; a tag is resolved to its "
                   "digest once, at submit (docs/containers.md)")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def submit(ctx, launcher, max_restarts, min_nodes, name, max_cost, as_user, workdir, cwd,
           as_json, resume_from, hang_timeout, command, mounts=(), data=None,
           data_shard=False, data_checksums=None, elastic=False, nnodes=None,
           image=None) -> None:
    """Submit COMMAND (after --) as a job on every node, as USER; prints the job id."""
    if workdir is not None and cwd is not None:
        raise errors.UsageError("--workdir ships a directory and runs the job in it: no "
                                "--cwd with it")
    argv = jobs_mod.submit_argv(tuple(command), launcher=launcher, max_restarts=max_restarts,
                                min_nodes=min_nodes, name=name, cwd=cwd, max_cost=max_cost,
                                resume_from=resume_from, hang_timeout=hang_timeout,
                                mounts=mounts, data=data, data_shard=data_shard,
                                data_checksums=data_checksums, elastic=elastic,
                                nnodes=nnodes, image=image)
    user = jobs_mod.job_user(target_of(ctx), as_user)
    # a master the idle stop stopped (idleStopMasterMinutes) is started and waited for
    wake.ensure_awake(target_of(ctx), lambda s: click.echo(s, err=True))
    remote = remote_of(ctx)
    staged = None
    if workdir is not None:
        from dlc import workdir as workdir_mod

        staged = workdir_mod.stage(target_of(ctx), workdir, user,
                                   lambda s: click.echo(s, err=True))
    jid, note = jobs_mod.submit(remote, argv, user, workdir=staged)
    if note:  # e.g. the workers were stopped while idle: starting again for this job
        click.echo(note, err=True)
    if as_json:
        emit_json({"job_id": jid})
    else:
        click.echo(jid)


@cli.command("jobs")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def jobs_cmd(ctx, as_json) -> None:
    """Every job the master's controller knows, newest last."""
    listing = jobs_mod.list_jobs(remote_of(ctx))
    if as_json:
        emit_json([jobs_mod.json_costs(j) for j in listing])
        return
    from rich.table import Table

    console = out()
    # at most JOBS_WIDTH columns (a terminal's usual width) even when piped: the long cells
    # (checkpoint paths, the message) wrap inside their columns, the job id never does
    t = Table(title="jobs", width=min(console.width, JOBS_WIDTH), pad_edge=False)
    t.add_column("job", no_wrap=True)
    for col in ("state", "nodes", "restarts", "submitted", "cost USD"):
        t.add_column(col)
    for col in ("checkpoint", "message", "stragglers"):
        t.add_column(col, overflow="fold", ratio=1)
    for j in listing:
        t.add_row(status_mod.job_id(j), str(j.get("state", "")),
                  f"{j.get('world_size', '-')}/{j.get('full_size', '-')}",
                  str(j.get("restarts", "-")), status_mod.clock(j.get("submitted_at")),
                  jobs_mod.cost_cell(j),
                  jobs_mod.checkpoint_text(j),
                  str(j.get("last_failure") or j.get("message") or ""),
                  "; ".join(j.get("stragglers") or ()) or "-")
    console.print(t)


@cli.command()
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="keep printing until the job is over")
@click.option("--node", type=click.IntRange(min=0), default=None, metavar="RANK",
              help="one node's log (default: every node's)")
@click.option("--source", type=click.Choice(LOG_SOURCES), default="auto", show_default=True,
              help="efs: from the master (EFS); cloudwatch: from the cluster's log group, "
                   "without the master; auto: efs, or cloudwatch when the master or EFS "
                   "cannot be reached")
@click.pass_context
def logs(ctx, job, follow, node, source) -> int:
    """A job's output, every node's lines whole and prefixed with the node; with -f until
    it ends (exit 0 if it succeeded, else 1). From CloudWatch, -f polls until interrupted."""
    out = lambda s: click.echo(s, nl=False)  # noqa: E731
    err = lambda s: click.echo(s, nl=False, err=True)  # noqa: E731
    final: dict = {}
    if source != "cloudwatch":
        try:
            try:
                remote = remote_of(ctx)
            except errors.DlcError as exc:  # no stack output, no running master
                raise jobs_mod.Unreachable(exc) from None
            final = jobs_mod.stream_logs(remote, job, node, out, err, follow=follow)
        except jobs_mod.Unreachable as exc:
            if source == "efs":
                raise exc.cause from None
            err(f"dlc: {exc.cause}; reading the cluster's CloudWatch log group instead\n")
            source = "cloudwatch"
    if source == "cloudwatch":
        cloudwatch.stream_job(target_of(ctx), job, node, out, err, follow=follow)
        return 0
    if not follow:
        return 0
    state = str(final.get("state"))
    click.echo(f"job {job} {state}", err=True)
    return 0 if state == "succeeded" else errors.EXIT_FAILED


@cli.command()
@click.argument("job")
@click.pass_context
def cancel(ctx, job) -> None:
    """Cancel a queued or running job."""
    click.echo(jobs_mod.cancel(remote_of(ctx), job))


@cli.command()
@click.option("--workers", type=int, default=None, metavar="N", help="set the worker count")
@click.option("--remove", default=None, metavar="ADDRESS",
              help="remove one elastic worker (drained first)")
@click.option("--replace", default=None, metavar="ADDRESS",
              help="replace one worker (a straggler) by a new instance (drained first)")
@click.option("--status", "show_status", is_flag=True,
              help="the nodes (base or elastic, joining, draining) and the worker group's "
                   "desired, minimum, maximum and base counts")
@click.pass_context
def scale(ctx, workers, remove, replace, show_status) -> int:
    """Grow or shrink the worker group, or replace a worker (dl-scale on the master)."""
    argv = jobs_mod.scale_argv(workers, remove, replace, status=show_status)
    code, stdout, stderr = jobs_mod.run_passthrough(remote_of(ctx), argv, timeout=120)
    click.echo(jobs_mod.laptop_terms(stdout), nl=False)
    click.echo(jobs_mod.laptop_terms(stderr), nl=False, err=True)
    return 0 if code == 0 else errors.EXIT_FAILED


@cli.command()
@click.option("--deep", is_flag=True, help="also run the health gate's checks on every node")
@click.option("--json", "as_json", is_flag=True, help="dl-health's JSON")
@click.pass_context
def health(ctx, deep, as_json) -> int:
    """dl-health on the master: every node, every check (exit 1 when unhealthy)."""
    argv = ["dl-health", *(["--deep"] if deep else []), *(["--json"] if as_json else [])]
    code, stdout, stderr = jobs_mod.run_passthrough(remote_of(ctx), argv, timeout=300)
    click.echo(stdout, nl=False)
    click.echo(stderr, nl=False, err=True)
    return 0 if code == 0 else errors.EXIT_FAILED


@cli.command()
@click.argument("node", default="master")
@click.option("--dry-run", is_flag=True, help="print the AWS CLI command instead")
@click.pass_context
def connect(ctx, node, dry_run) -> None:
    """A root shell on NODE (master, a rank, an address or an instance id) via Session
    Manager; needs the stack's opt-in AdminSessionPolicyArn policy."""
    target = target_of(ctx)
    inst = session.resolve_node(target, node)
    session.start(target, session.connect_argv(target, inst.instance_id), dry_run=dry_run,
                  echo=click.echo)


@cli.command()
@click.argument("port", type=int)
@click.option("--node", default="master", show_default=True,
              help="master, a rank, an address or an instance id")
@click.option("--local-port", type=int, default=None, help="local port (default: PORT)")
@click.option("--dry-run", is_flag=True, help="print the AWS CLI command instead")
@click.pass_context
def tunnel(ctx, port, node, local_port, dry_run) -> None:
    """Forward localhost:LOCAL-PORT to PORT on a node (AWS-StartPortForwardingSession)."""
    session.check_ports(port, local_port or port)  # before any AWS call
    target = target_of(ctx)
    inst = session.resolve_node(target, node)
    session.start(target, session.tunnel_argv(target, inst.instance_id, port,
                                              local_port or port),
                  dry_run=dry_run, echo=click.echo)


@cli.command("tensorboard")
@click.argument("job")
@click.option("--local-port", type=int, default=None,
              help="local port (default: the master's TensorBoard port, 6006 if free)")
@click.option("--minutes", type=click.IntRange(min=1), default=120, show_default=True,
              help="TensorBoard stops by itself after this long")
@click.option("--stop", is_flag=True, help="stop the job's TensorBoard on the master")
@click.option("--dry-run", is_flag=True,
              help="start TensorBoard, print the port forwarding command instead of running it")
@click.pass_context
def tensorboard_cmd(ctx, job, local_port, minutes, stop, dry_run) -> None:
    """The job's TensorBoard: started on the master as the job's user (127.0.0.1 only), and
    localhost:LOCAL-PORT forwarded to it (AWS-StartPortForwardingSession, as dlc tunnel)."""
    from dlc import tensorboard

    if local_port is not None:
        session.check_ports(local_port, local_port)  # before any AWS call
    remote = remote_of(ctx)
    if stop:
        click.echo(tensorboard.stop_board(remote, job))
        return
    tensorboard.open_board(target_of(ctx), remote, job, minutes=minutes, local_port=local_port,
                           dry_run=dry_run, echo=click.echo)


def main(argv: list[str] | None = None) -> int:
    """The console script: runs the command, turns every failure into a message and an
    exit code (never a traceback for an expected failure)."""
    from botocore.exceptions import BotoCoreError, ClientError

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        result = cli.main(args=argv, prog_name="dlc", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        err.print("dlc: aborted")
        return errors.EXIT_FAILED
    except errors.DlcError as exc:
        err.print(f"[bold red]dlc: error:[/] {escape(str(exc))}")
        return exc.exit_code
    except (ClientError, BotoCoreError) as exc:  # a call not wrapped by dlc.aws.call
        from dlc.aws import aws_error

        err.print(f"dlc: error: {aws_error(exc, 'an AWS call')}", markup=False)
        return errors.EXIT_AWS
    except KeyboardInterrupt:
        err.print("dlc: interrupted")
        return 130
    return int(result) if isinstance(result, int) else errors.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

"""Jobs and capacity through the master's own CLIs: ``dl-run --detach``, ``dl-jobs``,
``dl-scale`` and ``dl-health``, each run on the master through :mod:`dlc.remote`.

The master's job controller owns the jobs (queue, restarts, logs on EFS); ``dlc`` only asks
it, so a job outlives the laptop that submitted it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from bootstrap_scripts.data.checkpoint_plan import CheckpointError, parse_s3_url
from bootstrap_scripts.ops.cost import parse_usd, plain
from bootstrap_scripts.protocol.data_source import (
    DataSourceError,
    check_data_options,
    check_mounts,
    parse_data_source,
)
from bootstrap_scripts.protocol.jobs import JobSpecError
from bootstrap_scripts.protocol.nnodes import TORCHRUN, NodeRangeError, check_torchrun_options
from bootstrap_scripts.protocol.run_request import check_image_option
from dlc import aws
from dlc.cost import usd as cost_usd
from dlc.errors import DlcError, NotFound, UsageError, listing
from dlc.remote import Remote, caller_user, check_user
from dlc.status import job_id, jobs_list, jobs_listing
from dlc.target import Target

#: How long one poll of ``dlc logs -f`` waits before asking again (seconds).
FOLLOW_POLL = 1.0


def master_remote(target: Target) -> Remote:
    stack = aws.describe_stack(target)
    nodes = aws.instances(target, stack)
    return Remote(target, aws.master_instance(target, stack, nodes).instance_id)


def submit_argv(command: tuple[str, ...], *, launcher: str | None, max_restarts: int | None,
                min_nodes: int | None, name: str | None, cwd: str | None = None,
                max_cost: str | None = None, resume_from: str | None = None,
                hang_timeout: float | None = None, mounts: tuple[str, ...] = (),
                data: str | None = None, data_shard: bool = False,
                data_checksums: str | None = None, elastic: bool = False,
                nnodes: str | None = None, image: str | None = None) -> list[str]:
    """``dl-run --detach --json [options] -- CMD``. ``nnodes`` (torchrun's ``N`` or
    ``MIN:MAX``; with ``elastic``, nodes beyond MAX wait as spares) and ``elastic`` (only
    with torchrun) are checked here with dl-run's own rules. ``max_cost``: ``--max-cost`` in USD,
    checked here (UsageError naming the value) so a bad one never reaches the master; the
    same for ``resume_from``, ``mounts`` and ``data`` (with the parser dl-run itself uses).
    ``data_checksums`` None leaves dl-run's own default (the cluster's ``dataChecksums``) in
    force."""
    if not command:
        raise UsageError("nothing to run: give the command after --, e.g. "
                         "dlc submit -- python -m bootstrap_scripts.examples.train_digits")
    argv = ["dl-run", "--detach", "--json"]
    if max_cost is not None:
        try:
            argv += ["--max-cost", plain(parse_usd(max_cost))]
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if launcher:
        argv += ["--launcher", launcher]
    if max_restarts is not None:
        argv += ["--max-restarts", str(max_restarts)]
    if min_nodes is not None:
        argv += ["--min-nodes", str(min_nodes)]
    if name:
        argv += ["--name", name]
    if cwd:
        argv += ["--cwd", cwd]
    if resume_from is not None:
        try:
            bucket, prefix = parse_s3_url(resume_from, "--resume-from")
        except CheckpointError as exc:
            raise UsageError(str(exc)) from None
        argv += ["--resume-from", f"s3://{bucket}/{prefix}"]
    if hang_timeout is not None:
        argv += ["--hang-timeout", f"{hang_timeout:g}"]
    try:  # dl-run's own rules (``protocol.nnodes``), so a bad one never reaches the master
        check_torchrun_options(launcher, elastic, nnodes)
    except NodeRangeError as exc:
        raise UsageError(str(exc)) from None
    if elastic:
        argv += ["--elastic"]
    if nnodes is not None:
        argv += ["--nnodes", nnodes]
    if image is not None:
        try:  # the request's own rule, so a bad reference never leaves here (a tag is
            # resolved to its digest on the master, by dl-run, as the job's user)
            check_image_option(image, launcher or TORCHRUN)
        except JobSpecError as exc:
            raise UsageError(str(exc).removeprefix(" field 'image': ")) from None
        argv += ["--image", image]
    try:  # checked here too, so a bad one never reaches the master
        check_mounts(tuple(mounts))
    except DataSourceError as exc:
        raise UsageError(str(exc)) from None
    for mount in mounts:
        argv += ["--mount", mount]
    return [*argv, *data_argv(data, data_shard, data_checksums), "--", *command]


def data_argv(data: str | None, shard: bool, mode: str | None) -> list[str]:
    """``--data`` / ``--data-shard`` / ``--data-checksums`` for dl-run, refused here by
    dl-run's own rules (``protocol.data_source.check_data_options``, in its words) so a bad
    one is a UsageError on the laptop rather than a failed submit on the master. ``mode``
    None leaves the cluster's default (``dataChecksums``) in force."""
    try:
        if data == "":  # given, and empty: a bad --data here (dl-run's "" means none)
            parse_data_source(data)
        check_data_options(data, shard, mode)
    except DataSourceError as exc:
        raise UsageError(str(exc)) from None
    if data is None:
        return []
    return ["--data", data, *(("--data-shard",) if shard else ()),
            *(("--data-checksums", mode) if mode is not None else ())]


def cost_cell(job: dict) -> str:
    """A job's cost as ``dl-jobs --json`` computed it (its ledger, ``ops/cost``): ``1.23``,
    ``1.23/5`` with a ``--max-cost``, ``unknown`` (a node's price unknown), ``-`` (no attempt
    ran, or a master whose dl-jobs predates the ledger)."""
    ledger = job.get("cost") if isinstance(job.get("cost"), dict) else {}
    spent = str(ledger.get("usd", "-")) if job.get("usage") else "-"
    if spent not in ("-", "unknown"):
        spent = cost_usd(spent)
    cap = job.get("max_cost_usd") or ""
    return spent + (f"/{cap}" if cap else "")


#: Decimal places of a cost in ``dlc jobs --json`` (a millionth of a dollar).
COST_PLACES = 6


def json_costs(job: dict) -> dict:
    """A job of ``dl-jobs --json`` as ``dlc jobs --json`` prints it: its cost a JSON number
    to :data:`COST_PLACES` places (the ledger's sums carry 30 digits), ``"unknown"`` kept."""
    ledger = job.get("cost")
    if not isinstance(ledger, dict):
        return job
    try:
        usd = round(float(Decimal(str(ledger.get("usd")))), COST_PLACES)
    except (InvalidOperation, ValueError):
        return job
    return {**job, "cost": {**ledger, "usd": usd}}


def job_user(target: Target, as_user: str | None) -> str:
    """``--as USER``, else the caller's cluster user (:func:`dlc.remote.caller_user`: their
    ``dl-user`` principal tag, else the name mapped from their IAM identity); never root.
    It only chooses which document dlc tries: IAM decides whether the caller may."""
    if as_user is not None:
        return check_user(as_user)
    return caller_user(target)


def submit(remote: Remote, argv: list[str], user: str, *, workdir: str | None = None
           ) -> tuple[str, str]:
    """``dl-run --detach`` as ``user`` on the master, through ``user``'s Command document
    (or the any-user one's ``runAs``; the document refuses root); with ``workdir``
    (``<bucket>/<key>`` staged by :mod:`dlc.workdir`) the job runs in that directory,
    unpacked into its own directory on EFS. Returns (job id, note)."""
    return submitted(remote.as_user(user).json(argv, run_as=user, workdir=workdir))


def submitted(data: object) -> tuple[str, str]:
    """(job id, note) from ``dl-run --detach --json``; the note says, say, that the
    cluster's workers were stopped while idle and are starting for this job."""
    answer = data if isinstance(data, dict) else {}
    jid = answer.get("job_id")
    if not jid:
        raise DlcError(f"dl-run --detach printed no job id: {data!r}")
    return str(jid), str(answer.get("note") or "")


def list_jobs(remote: Remote) -> list[dict]:
    """Every job, read in pages below Run Command's output limit (:func:`jobs_listing`)."""
    return jobs_list(jobs_listing(remote))


def _known(remote: Remote, jid: str) -> None:
    """NotFound naming the jobs that exist, if ``jid`` is not one of them."""
    try:
        ids = [job_id(j) for j in list_jobs(remote)]
    except DlcError:
        return  # cannot tell: the caller reports its own failure
    if jid not in ids:
        raise NotFound(f"job {jid} not found on the cluster; jobs: {listing(ids)}")


def page_argv(jid: str, cursor: str, node: int | None) -> list[str]:
    """``dl-jobs logs ID --cursor C [--node RANK]``: one page of the job's output after the
    cursor, as JSON (bootstrap_scripts/jobs/cli/log_pages.py)."""
    return ["dl-jobs", "logs", jid, "--cursor", cursor,
            *(["--node", str(node)] if node is not None else [])]


def read_page(remote: Remote, jid: str, cursor: str, node: int | None) -> dict:
    try:
        data = remote.json(page_argv(jid, cursor, node))
    except DlcError:
        _known(remote, jid)
        raise
    if not isinstance(data, dict) or not isinstance(data.get("cursor"), str):
        raise DlcError(f"dl-jobs logs {jid} --cursor answered no page: {str(data)[:300]!r}")
    return data


class Unreachable(DlcError):
    """The master (or EFS behind it) could not answer the first page: ``cause`` says why
    (``dlc logs`` then reads CloudWatch Logs, unless ``--source efs``)."""

    def __init__(self, cause: DlcError) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.exit_code = cause.exit_code


def waiting_line(jid: str, state: str) -> str:
    """What ``dlc logs`` says once when the job has not started: a user following it sees
    why nothing comes, and how to give up."""
    return (f"dlc: job {jid} is {state}: waiting for the controller to start it on its nodes "
            f"(dlc status shows the cluster; dlc cancel {jid} gives up)\n")


def stream_logs(remote: Remote, jid: str, node: int | None, write: Callable[[str], None],
                write_err: Callable[[str], None], *, follow: bool,
                poll: float | None = None, timeout: float | None = None) -> dict:
    """Print the job's output page after page, each node's lines whole and prefixed with
    the node, nothing lost or repeated: the master hands out pages from a cursor that holds
    one offset per node log (it stays with ``dlc``, the master keeps nothing); with
    ``follow``, until the job is over, whichever way it ends (succeeded, failed, cancelled,
    stopped at its budget, cancelled before it ever started). A job still queued is said
    once on stderr (:func:`waiting_line`). Returns the last page (its ``state``).
    ``poll``: seconds between pages once drained (default :data:`FOLLOW_POLL`)."""
    poll = FOLLOW_POLL if poll is None else poll
    cursor = "1"
    deadline = None if timeout is None else time.monotonic() + timeout
    said_waiting = False
    while True:
        try:
            page = read_page(remote, jid, cursor, node)
        except NotFound:
            raise  # the job is not the cluster's: CloudWatch would not know it either
        except DlcError as exc:
            if cursor == "1":  # nothing printed yet: another source may take over
                raise Unreachable(exc) from None
            raise
        cursor = page["cursor"]
        if page.get("state") == "queued" and not said_waiting:
            write_err(waiting_line(jid, "queued"))
            said_waiting = True
        if page.get("out"):
            write("".join(line + "\n" for line in page["out"]))
        if page.get("err"):
            write_err("".join(line + "\n" for line in page["err"]))
        if page.get("more"):
            continue
        if page.get("done") or not follow:
            return page
        if deadline is not None and time.monotonic() > deadline:
            raise DlcError(f"job {jid} still {page.get('state')} after {timeout:.0f} s of "
                           "following; it keeps running (dlc logs -f to follow again)")
        time.sleep(poll)


def cancel(remote: Remote, jid: str) -> str:
    """``dl-jobs cancel`` through the caller's document: a per-user document cancels only
    its own user's jobs (dl-jobs refuses others), the any-user one any job."""
    res = remote.run(["dl-jobs", "cancel", jid])
    if not res.ok:
        _known(remote, jid)
        raise DlcError(f"dl-jobs cancel {jid} failed on the master (exit {res.code}): "
                       f"{res.message()}")
    return res.stdout.strip() or f"cancelled {jid}"


def scale_argv(workers: int | None, remove: str | None, replace: str | None = None, *,
               status: bool = False) -> list[str]:
    if sum(x is not None for x in (workers, remove, replace)) + status != 1:
        raise UsageError("give exactly one of --workers N, --remove ADDRESS, "
                         "--replace ADDRESS or --status")
    if status:
        return ["dl-scale", "--status"]
    if workers is not None:
        if workers < 0:
            raise UsageError(f"--workers must be >= 0, got {workers}")
        return ["dl-scale", "--workers", str(workers)]
    if replace is not None:
        return ["dl-scale", "--replace", str(replace)]
    return ["dl-scale", "--remove", str(remove)]


def laptop_terms(text: str) -> str:
    """``dl-scale``'s own output as ``dlc scale`` shows it: where it points to its own
    options (``dl-scale --status``), the laptop's command that runs them."""
    return text.replace("dl-scale --", "dlc scale --")


def run_passthrough(remote: Remote, argv: list[str], timeout: int) -> tuple[int, str, str]:
    """A master command whose output is shown as is (``dl-scale``, ``dl-health``)."""
    res = remote.run(argv, timeout=timeout)
    if res.code == 127:
        raise DlcError(f"{argv[0]} is not installed on the master {remote.instance_id}: "
                       f"{res.message()}")
    return res.code, res.stdout, res.stderr


def checkpoint_text(job: dict) -> str:
    """Where a job's newest complete checkpoint is, from ``dl-jobs --json``'s
    ``checkpoint`` (its EFS manifest and the s3:// manifest the mirror last uploaded)."""
    where = job.get("checkpoint")
    if not isinstance(where, dict):
        return "-"
    return "\n".join(str(where[k]) for k in ("efs", "s3") if where.get(k)) or "-"

"""Jobs and capacity through the master's own CLIs: ``dl-run --detach``, ``dl-jobs``,
``dl-scale`` and ``dl-health``, each run on the master through :mod:`dlc.remote`.

The master's job controller owns the jobs (queue, restarts, logs on EFS); ``dlc`` only asks
it, so a job outlives the laptop that submitted it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from dlc import aws
from dlc.errors import DlcError, NotFound, UsageError, listing
from dlc.remote import Remote, check_user, user_from_arn
from dlc.status import FINISHED, job_id, jobs_list
from dlc.target import Target

#: How long one poll of ``dlc logs -f`` waits before asking again (seconds).
FOLLOW_POLL = 1.0


def master_remote(target: Target) -> Remote:
    stack = aws.describe_stack(target)
    nodes = aws.instances(target, stack)
    return Remote(target, aws.master_instance(target, stack, nodes).instance_id)


def submit_argv(command: tuple[str, ...], *, launcher: str | None, max_restarts: int | None,
                min_nodes: int | None, name: str | None) -> list[str]:
    """``dl-run --detach --json [options] -- CMD``."""
    if not command:
        raise UsageError("nothing to run: give the command after --, e.g. "
                         "dlc submit -- python -m bootstrap_scripts.examples.train_digits")
    argv = ["dl-run", "--detach", "--json"]
    if launcher:
        argv += ["--launcher", launcher]
    if max_restarts is not None:
        argv += ["--max-restarts", str(max_restarts)]
    if min_nodes is not None:
        argv += ["--min-nodes", str(min_nodes)]
    if name:
        argv += ["--name", name]
    return [*argv, "--", *command]


def job_user(target: Target, as_user: str | None) -> str:
    """``--as USER``, else the user mapped from the caller's IAM identity
    (:func:`dlc.remote.user_from_arn`); never root."""
    if as_user is not None:
        return check_user(as_user)
    arn = aws.caller_arn(target)
    user = user_from_arn(arn)
    if user == "root":
        raise UsageError(f"your IAM identity {arn} maps to the user root, which jobs never "
                         "run as: give --as USER")
    return check_user(user)


def submit(remote: Remote, argv: list[str], user: str) -> str:
    """``dl-run --detach`` as ``user`` on the master (the document refuses root)."""
    data = remote.json(argv, run_as=user)
    jid = data.get("job_id") if isinstance(data, dict) else None
    if not jid:
        raise DlcError(f"dl-run --detach printed no job id: {data!r}")
    return str(jid)


def list_jobs(remote: Remote) -> list[dict]:
    return jobs_list(remote.json(["dl-jobs", "--json"]))


def _known(remote: Remote, jid: str) -> None:
    """NotFound naming the jobs that exist, if ``jid`` is not one of them."""
    try:
        ids = [job_id(j) for j in list_jobs(remote)]
    except DlcError:
        return  # cannot tell: the caller reports its own failure
    if jid not in ids:
        raise NotFound(f"job {jid} not found on the cluster; jobs: {listing(ids)}")


def show(remote: Remote, jid: str) -> dict:
    res = remote.run(["dl-jobs", "show", jid, "--json"])
    if not res.ok:
        _known(remote, jid)
        raise DlcError(f"dl-jobs show {jid} failed on the master (exit {res.code}): "
                       f"{res.message()}")
    try:
        data = json.loads(res.stdout)
    except ValueError:
        raise DlcError(f"dl-jobs show {jid} printed no JSON: {res.stdout[:300]!r}") from None
    return data.get("job", data) if isinstance(data, dict) else {}


def logs_argv(jid: str, node: int | None) -> list[str]:
    return ["dl-jobs", "logs", jid, *(["--node", str(node)] if node is not None else [])]


def read_logs(remote: Remote, jid: str, node: int | None, offset: int = 0) -> tuple[str, int]:
    try:
        return remote.read_chunked(logs_argv(jid, node), offset=offset)
    except DlcError:
        _known(remote, jid)
        raise


def follow(remote: Remote, jid: str, node: int | None, write: Callable[[str], None], *,
           poll: float = FOLLOW_POLL, timeout: float | None = None) -> dict:
    """Print the job's log as it grows until the job is over; returns its last record.
    The state is read before the log, so the log read after a finished state is complete."""
    offset = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        job = show(remote, jid)
        text, offset = read_logs(remote, jid, node, offset)
        if text:
            write(text)
        if str(job.get("state")) in FINISHED:
            return job
        if deadline is not None and time.monotonic() > deadline:
            raise DlcError(f"job {jid} still {job.get('state')} after {timeout:.0f} s of "
                           "following; it keeps running (dlc logs -f to follow again)")
        time.sleep(poll)


def cancel(remote: Remote, jid: str) -> str:
    res = remote.run(["dl-jobs", "cancel", jid])
    if not res.ok:
        _known(remote, jid)
        raise DlcError(f"dl-jobs cancel {jid} failed on the master (exit {res.code}): "
                       f"{res.message()}")
    return res.stdout.strip() or f"cancelled {jid}"


def scale_argv(workers: int | None, remove: str | None) -> list[str]:
    if (workers is None) == (remove is None):
        raise UsageError("give exactly one of --workers N or --remove ADDRESS")
    if workers is not None:
        if workers < 0:
            raise UsageError(f"--workers must be >= 0, got {workers}")
        return ["dl-scale", "--workers", str(workers)]
    return ["dl-scale", "--remove", str(remove)]


def run_passthrough(remote: Remote, argv: list[str], timeout: int) -> tuple[int, str, str]:
    """A master command whose output is shown as is (``dl-scale``, ``dl-health``)."""
    res = remote.run(argv, timeout=timeout)
    if res.code == 127:
        raise DlcError(f"{argv[0]} is not installed on the master {remote.instance_id}: "
                       f"{res.message()}")
    return res.code, res.stdout, res.stderr

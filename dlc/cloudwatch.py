"""``dlc logs --source cloudwatch`` and the dashboard's URL: the cluster's CloudWatch side.

Every node ships its logs to the cluster's log group, one stream per node and source
(``<instance-id>/<source>``, ``bootstrap_scripts/metrics/metric_names.py``); the jobs' output is in
the ``<instance-id>/jobs`` streams, each line ``<user>/<attempt id> [<rank> <address>] <line>``
(``bootstrap_scripts/jobs/executor/log_mirror.py``). Reading a job there needs neither the
master nor EFS: the nodes may be gone, the lines stay for the log group's retention. Lines
come out with the prefix ``dlc logs`` prints from EFS; ``-f`` polls for new ones until
interrupted (the job's state is the master's to tell).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

from bootstrap_scripts.metrics import metric_names as names
from dlc import aws
from dlc.errors import DlcError, NotFound
from dlc.target import Target

#: The stack outputs naming the log group and the dashboard.
LOG_GROUP_OUTPUT = "LogGroupName"
DASHBOARD_OUTPUT = "DashboardName"
#: Seconds between two polls of ``dlc logs -f --source cloudwatch``.
FOLLOW_POLL = 2.0
#: FilterLogEvents takes at most this many stream names per call.
MAX_STREAMS = 100


def log_group(target: Target) -> str:
    """The cluster's log group: the stack's output, or by its naming rule when the stack
    cannot be read (``/deeplearning/<cluster id>``, the cluster id being the stack name)."""
    try:
        stack = aws.describe_stack(target)
    except DlcError:
        return names.log_group_name(target.stack)
    return stack.outputs.get(LOG_GROUP_OUTPUT) or names.log_group_name(stack.name)


def job_streams(target: Target, group: str) -> list[str]:
    """Every node's jobs stream in ``group`` (NotFound if the group does not exist)."""
    from botocore.exceptions import BotoCoreError, ClientError  # as dlc.aws: when needed

    client = target.client("logs")
    streams: list[str] = []
    token = None
    while True:
        kwargs = {"logGroupName": group, **({"nextToken": token} if token else {})}
        try:
            page = client.describe_log_streams(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                raise NotFound(f"log group {group} not found in {target.region}: the "
                               "cluster's logs are deleted with its stack") from None
            raise aws.aws_error(exc, f"DescribeLogStreams {group}") from None
        except BotoCoreError as exc:
            raise aws.aws_error(exc, f"DescribeLogStreams {group}") from None
        streams += [s["logStreamName"] for s in page.get("logStreams", [])
                    if s["logStreamName"].endswith("/" + names.SOURCE_JOBS)]
        token = page.get("nextToken")
        if not token:
            return sorted(streams)


def job_line(message: str, job: str, node: int | None) -> str | None:
    """The printable line of one event of ``job`` (a bare id: any user's, or ``USER/ID``;
    any attempt), None for another job's or another node's."""
    m = re.match(r"^(\S+) (\[(\d+) .*)$", message)
    if m is None:
        return None
    user, _sep, attempt = m.group(1).rpartition("/")  # the job's key: <user>/<attempt id>
    want_user, _sep, want = job.rpartition("/")  # a bare id, or USER/ID
    if (want_user and user != want_user) or (
            attempt != want and not re.fullmatch(re.escape(want) + r"\.[0-9]+", attempt)):
        return None
    if node is not None and int(m.group(3)) != node:
        return None
    return m.group(2)


def events(target: Target, group: str, streams: list[str], start_ms: int) -> Iterator[dict]:
    """Every event of ``streams`` from ``start_ms`` on, in time order per call."""
    client = target.client("logs")
    for i in range(0, len(streams), MAX_STREAMS):
        token = None
        while True:
            kwargs = {"logGroupName": group, "logStreamNames": streams[i:i + MAX_STREAMS],
                      "startTime": start_ms, **({"nextToken": token} if token else {})}
            page = aws.call(f"FilterLogEvents {group}", client.filter_log_events, **kwargs)
            yield from page.get("events", [])
            token = page.get("nextToken")
            if not token:
                break


def stream_job(target: Target, job: str, node: int | None, write: Callable[[str], None],
               write_err: Callable[[str], None], *, follow: bool, poll: float = FOLLOW_POLL,
               timeout: float | None = None) -> int:
    """Print ``job``'s lines from the cluster's log group; with ``follow``, keep polling
    (until ``timeout`` seconds, or interrupted). Returns how many lines were printed."""
    group = log_group(target)
    seen: set[str] = set()
    start = 0
    printed = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        streams = job_streams(target, group)
        fresh = [e for e in events(target, group, streams, start) if e["eventId"] not in seen]
        # stable: a stream's events keep the order the service gave them
        fresh.sort(key=lambda e: (e["timestamp"], e.get("logStreamName", "")))
        out = []
        for event in fresh:
            seen.add(event["eventId"])
            start = max(start, event["timestamp"])
            line = job_line(event["message"].rstrip("\n"), job, node)
            if line is not None:
                out.append(line + "\n")
        if out:
            write("".join(out))
            printed += len(out)
        if not follow or (deadline is not None and time.monotonic() > deadline):
            if not printed and not follow:
                write_err(f"dlc: no lines of job {job} in {group} (yet: the agents upload "
                          "every few seconds)\n")
            return printed
        time.sleep(poll)


def console_host(region: str) -> str:
    """The console's host name for a region's partition."""
    if region.startswith("cn-"):
        return "console.amazonaws.cn"
    if region.startswith("us-gov-"):
        return "console.amazonaws-us-gov.com"
    return f"{region}.console.aws.amazon.com"


def dashboard_url(region: str, dashboard: str) -> str:
    """The CloudWatch console's page of a dashboard."""
    return (f"https://{console_host(region)}/cloudwatch/home?region={region}"
            f"#dashboards/dashboard/{dashboard}")

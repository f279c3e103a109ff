"""``dl-jobs``: the managed jobs of the cluster, their restarts, logs, and cancelling them.

    dl-jobs [--json]                   every job, oldest first, and whether a controller runs
    dl-jobs --json --from K            the same as one page from the K-th job (``dlc jobs``)
    dl-jobs show ID [--json]           one job: state, attempts, restarts (each with its cause)
    dl-jobs logs ID [-f] [--node RANK] its output, attempt after attempt
    dl-jobs logs ID --cursor C         one page of it as JSON, from a cursor (``dlc logs``)
    dl-jobs cancel ID                  a queued job never runs; a running one is stopped
    dl-jobs tensorboard ID [--stop]    its TensorBoard on 127.0.0.1, as its user (JSON)

Each job's cost is its ledger (``ops/cost``): its attempts' node-seconds x each node's
price, as the controller recorded them; a running attempt counts up to now.

Reads EFS only (``managed/``, ``jobs/``, ``cluster/controller.json``,
``cluster/idle-stop.json``), so it works on any node.

Why ``--from``: the list grows with every job (each with its ledger, per attempt and node),
and Run Command returns only the first 24,000 characters of a command's output, so a whole
list read through it is cut after a dozen jobs. ``--json --from K`` prints the jobs from the
K-th on, compact, as many as fit :data:`LIST_PAGE_BYTES` (at least one), and ``next``: the
index to ask from next, null after the last; ``dlc`` reads page after page.

Exit status: 0, 1 (the job of ``logs -f`` did not succeed), 2 (usage, unknown job, another
user's job).

``DL_OPERATOR_USER=<user>`` in the environment (set by an operator's per-user Command
document, ``constructs_lib/operator_document.py``, which runs dl-jobs as root): ``cancel``
refuses a job that is not that user's. An argument could not carry it: the document appends
the operator's own arguments, and a second option would override the first.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path

from bootstrap_scripts.data.checkpoint_plan import MANIFEST_SUFFIX
from bootstrap_scripts.jobs.cli import log_pages
from bootstrap_scripts.jobs.cli.follow import final_message, follow
from bootstrap_scripts.jobs.engine import checkpoints, managed
from bootstrap_scripts.jobs.engine.node_env import read_node_env
from bootstrap_scripts.jobs.engine.restart_policy import JobState
from bootstrap_scripts.ops import cost, tensorboard_server
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ManagedPaths, NodePaths

EXIT_FAILED = 1
EXIT_USAGE = 2
#: A ``--json --from K`` page's jobs take at most this many bytes of JSON (one job more
#: than that goes alone); the rest of the answer is small (Run Command returns 24,000
#: characters of stdout).
LIST_PAGE_BYTES = 16_000
#: The cluster user an operator's per-user Command document acts for (its cancels only).
OPERATOR_USER_ENV = "DL_OPERATOR_USER"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dl-jobs", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=os.environ.get("DL_ROOT", "/"),
                   help="node root prefix where the agent wrote its files (default: /)")
    p.add_argument("--mount-point", default="", help="EFS mount point (default: the "
                   "membership's)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--from", type=int, default=None, dest="start", metavar="K",
                   help="with --json: one page of the list, from the K-th job (0: the "
                        "first), with the index to ask from next")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("list", help="every job (the default)")
    show = sub.add_parser("show", help="one job and its restarts")
    show.add_argument("job_id")
    show.add_argument("--json", action="store_true", dest="json_show")
    logs = sub.add_parser("logs", help="a job's output, every attempt")
    logs.add_argument("job_id")
    logs.add_argument("-f", "--follow", action="store_true", help="keep following it")
    logs.add_argument("--node", type=int, default=None, metavar="RANK",
                      help="only this node rank's output")
    logs.add_argument("--no-prefix", action="store_true")
    logs.add_argument("--cursor", default=None, metavar="CURSOR",
                      help="print one page of the output after CURSOR as JSON, with the "
                           "cursor to ask with next (1: from the start; log_pages.py)")
    cancel = sub.add_parser("cancel", help="cancel a queued or running job")
    cancel.add_argument("job_id")
    board = sub.add_parser("tensorboard", help="serve the job's TensorBoard on 127.0.0.1 as "
                           "the job's user (ops/tensorboard_server.py); prints JSON")
    board.add_argument("job_id")
    board.add_argument("--port", type=int, default=tensorboard_server.DEFAULT_PORT,
                       help="first port to try (default: %(default)s)")
    board.add_argument("--minutes", type=int, default=tensorboard_server.DEFAULT_MINUTES,
                       help="it stops by itself after this long (default: %(default)s)")
    board.add_argument("--stop", action="store_true", help="stop the job's TensorBoard")
    return p.parse_args(argv)


def efs_of(args: argparse.Namespace) -> Path:
    if args.mount_point:
        return Path(args.mount_point)
    try:
        return Path(Membership.load(NodePaths(args.root).membership).efs_mount)
    except (OSError, ValueError):
        return Path(read_node_env(NodePaths(args.root)).get("EFS_MOUNT") or "/efs")


def when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def with_cost(job: ManagedJob, now: float) -> dict:
    """The job's record with its ledger (``cost``), for --json."""
    return {**job.to_dict(), "cost": cost.job_cost(job.usage, now).to_dict()}


def cost_cell(job: ManagedJob, now: float) -> str:
    """``12.35`` (USD), ``12.35/50`` with a cap, ``-`` before any attempt ran."""
    spent = cost.usd(cost.job_cost(job.usage, now).usd) if job.usage else "-"
    return spent + (f"/{job.max_cost_usd}" if job.max_cost_usd else "")


def list_page(entries: Iterable[dict], budget: int = LIST_PAGE_BYTES
              ) -> tuple[list[dict], bool]:
    """The first entries whose compact JSON fits ``budget`` bytes (at least one, so a page
    always moves on), and whether any are left. Lazy: the entries after the page are not
    made (each reads the job's checkpoint manifests)."""
    taken: list[dict] = []
    used = 0
    for entry in entries:
        size = len(json.dumps(entry, sort_keys=True, separators=(",", ":"))) + 1
        if taken and used + size > budget:
            return taken, True
        taken.append(entry)
        used += size
    return taken, False


def print_list(efs: Path, as_json: bool, start: int | None = None) -> int:
    jobs = managed.list_jobs(efs)
    status = managed.controller_status(efs)
    idle = managed.idle_stop(efs)
    now = time.time()
    if as_json:
        head = {"controller": {"alive": status.alive, "status": status.text},
                "idle_stop": idle.to_dict() if idle else None}
        if start is not None:
            if start < 0:
                print(f"dl-jobs: error: --from must be >= 0, got {start}", file=sys.stderr)
                return EXIT_USAGE
            page, more = list_page({**with_cost(j, now),
                                    "checkpoint": checkpoints.last_checkpoint(efs, j)}
                                   for j in jobs[start:])
            print(json.dumps({**head, "jobs": page, "total": len(jobs),
                              "next": start + len(page) if more else None},
                             sort_keys=True, separators=(",", ":")))
            return 0
        print(json.dumps({**head,
                          "jobs": [{**with_cost(j, now),
                                    "checkpoint": checkpoints.last_checkpoint(efs, j)}
                                   for j in jobs]}, indent=2, sort_keys=True))
        return 0
    print(status.text)
    print(managed.idle_text(idle, when))
    if not jobs:
        print("no jobs")
        return 0
    rows = [("JOB", "STATE", "ATTEMPT", "RESTARTS", "NODES", "USER", "SUBMITTED",
             "COST USD", "CHECKPOINT", "STRAGGLERS", "LAST FAILURE")]
    rows += [(j.job_id, state_cell(j), str(j.attempt), str(j.restarts), str(j.world_size),
              j.user or "-", when(j.submitted_at),
              cost_cell(j, now),
              checkpoint_text(checkpoints.last_checkpoint(efs, j)), stragglers_cell(j),
              (j.last_failure or "-")[:70]) for j in jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    return 0


#: What to do about a straggler's node (``dl-scale --replace`` on the master).
STRAGGLER_HINT = " (to replace a node: dlc scale --replace ADDRESS, or dl-scale --replace " \
    "ADDRESS on the master)"


def state_cell(job: ManagedJob) -> str:
    """The job's state, and ``(stalled N min)`` while its running attempt makes no
    progress."""
    if job.stalled and not JobState(job.state).terminal:
        return f"{job.state} (stalled {job.stalled.rpartition(' for ')[2]})"
    return job.state


def stragglers_cell(job: ManagedJob) -> str:
    """``rank 3, rank 5`` of the running attempt's stragglers, ``-`` for none."""
    if JobState(job.state).terminal or not job.stragglers:
        return "-"
    return ", ".join(s.split(" on ")[0] for s in job.stragglers)


def money(value: Decimal | None) -> str:
    return f"{cost.usd(value)} USD" if value is not None else "unknown"


def ledger_lines(job: ManagedJob, now: float) -> list[str]:
    """``cost:`` and one line per attempt: its span, nodes and what each node cost."""
    ledger = cost.job_cost(job.usage, now)
    head = (f"{'cost:':14}{money(ledger.usd)} ({ledger.node_seconds / 3600:.3f} "
            f"node-hours)" if job.usage else f"{'cost:':14}- (no attempt ran)")
    head += f" of --max-cost {job.max_cost_usd} USD" if job.max_cost_usd else ""
    lines = [head]
    lines += [f"{'':14}unknown price: {u}" for u in ledger.unknown]
    for usage, (_n, spent) in zip(job.usage, ledger.by_attempt, strict=True):
        end = usage.ended_at if usage.ended_at is not None else now
        nodes = ", ".join(f"{n.instance_id} {n.instance_type or '?'} {n.market or '?'} "
                          f"{n.usd_per_hour or '?'}/h" for n in usage.nodes)
        lines.append(f"attempt {usage.attempt}: {when(usage.started_at)} for "
                     f"{max(0.0, end - usage.started_at):.0f} s"
                     f"{'' if usage.ended_at is not None else ' (running)'}: "
                     f"{money(spent)} on {nodes or 'no node'}")
    return lines


def checkpoint_text(where: dict[str, str]) -> str:
    """``step-000120 (efs, s3)``: the newest complete checkpoint's name and where it is."""
    names = {k: v.rsplit("/", 1)[-1].removesuffix(MANIFEST_SUFFIX) for k, v in where.items()
             if v}
    if not names:
        return "-"
    newest = names.get("efs") or names["s3"]
    return f"{newest} ({', '.join(k for k, v in names.items() if v == newest)})"


def print_show(job: ManagedJob, as_json: bool, efs: Path) -> int:
    now = time.time()
    where = checkpoints.last_checkpoint(efs, job)
    if as_json:
        print(json.dumps({**with_cost(job, now), "checkpoint": where}, indent=2,
                         sort_keys=True))
        return 0
    for label, value in (
            ("job", job.job_id), ("state", job.state), ("user", job.user or "-"),
            ("submitted", when(job.submitted_at)), ("started", when(job.started_at)),
            ("finished", when(job.finished_at)), ("attempt", str(job.attempt)),
            ("restarts", str(job.restarts)), ("world size", f"{job.world_size} node(s) "
                                              f"(first attempt: {job.full_size})"),
            ("excluded", ", ".join(job.excluded) or "-"),
            ("last failure", job.last_failure or "-"),
            ("health gate", "; ".join(job.gate_failures) or "-"),
            ("stragglers", "; ".join(job.stragglers) + STRAGGLER_HINT
             if stragglers_cell(job) != "-" else "-"),
            ("progress", job.stalled if job.stalled and not JobState(job.state).terminal
             else "-"),
            ("message", job.message or "-"),
            ("checkpoint", where["efs"] or "-"), ("mirrored", where["s3"] or "-")):
        print(f"{label + ':':14}{value}")
    for line in ledger_lines(job, now):
        print(line)
    for k, r in enumerate(job.restart_log, start=1):
        resumed = (f"epoch {r.resumed_epoch} step {r.resumed_step}"
                   if r.resumed_epoch is not None else "no checkpoint")
        took = f"{r.seconds_to_resume:.1f} s" if r.seconds_to_resume is not None else "-"
        node = f"{r.address} ({r.instance_id})" if r.address else "-"
        print(f"restart {k}: {when(r.at)} after attempt {r.attempt}: {r.kind}, node {node}"
              f"{', marked Unhealthy' if r.marked_unhealthy else ''}"
              f"{', ' + r.health_error if r.health_error else ''}; replacement "
              f"{r.replacement_instance_id or '-'}; resumed on {r.next_world_size or '-'} "
              f"node(s) from {resumed} in {took}: {r.detail}")
        if r.world == "survivors-now":  # elastic: restarted at once, grows back later
            print(f"  restarted on {r.next_world_size} of {r.full_size} node(s) at once "
                  f"(elastic); " + (f"replacement {r.admitted_instance_ids} passed the health "
                                    f"gate and " + ("joined " + when(r.joined_at)
                                                    if r.joined_at else "is joining")
                                    if r.admitted_instance_ids else
                                    "the replacement joins when ready"))
        if r.kind == "hang":  # every rank's stack, as the controller recorded it
            print(f"  stacks: <EFS>/managed/{job.job_id}/attempts/{r.attempt}.hang.json")
    for x in job.node_losses:  # elastic: lost while the attempt trained on without it
        print(f"node lost {when(x.at)} during attempt {x.attempt}: {x.address} "
              f"({x.instance_id or '-'})"
              + (", marked Unhealthy" if x.marked_unhealthy else "")
              + (f", {x.health_error}" if x.health_error else "") + f": {x.detail}")
    return 0


def print_page(efs: Path, args: argparse.Namespace, ranks: frozenset[int] | None) -> int:
    """``logs ID --cursor C``: the next page after C (log_pages.py), as JSON."""
    try:
        cursor = log_pages.Cursor.parse(args.cursor)
    except ValueError as exc:
        print(f"dl-jobs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    page = log_pages.read_page(efs, args.job_id, cursor, ranks=ranks,
                               prefix=not args.no_prefix)
    # UTF-8 whatever the node's locale: the page's size is counted in UTF-8 bytes
    sys.stdout.flush()
    sys.stdout.buffer.write(json.dumps(page.to_dict(), ensure_ascii=False).encode() + b"\n")
    sys.stdout.buffer.flush()
    return 0


def serve_tensorboard(paths: ManagedPaths, args: argparse.Namespace) -> int:
    """``dl-jobs tensorboard``: start (or stop) the job's TensorBoard; JSON on stdout."""
    try:
        if args.stop:
            print(json.dumps({"job_id": paths.job_id,
                              "message": tensorboard_server.stop(paths)}))
            return 0
        if not 1 <= args.port <= 65535 or args.minutes < 1:
            raise tensorboard_server.TensorBoardError("--port must be 1..65535 and "
                                                      "--minutes at least 1")
        served = tensorboard_server.start(paths, port=args.port, minutes=args.minutes)
    except tensorboard_server.TensorBoardError as exc:
        print(f"dl-jobs: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(dataclasses.asdict(served)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    efs = efs_of(args)
    try:
        if args.command in (None, "list"):
            return print_list(efs, args.json, args.start if args.json else None)
        # a bare id (the caller's own job first; an operator's: their user's) or USER/ID
        paths = managed.find(efs, args.job_id, mine=os.environ.get(OPERATOR_USER_ENV) or None)
        args.job_id = paths.key
        if args.command == "show":
            job = managed.view(paths)
            if job is None:
                raise managed.ManagedError(f"job {args.job_id} has no readable record")
            return print_show(job, args.json or args.json_show, efs)
        if args.command == "cancel":
            print(managed.cancel(efs, args.job_id,
                                 for_user=os.environ.get(OPERATOR_USER_ENV) or None))
            return 0
        if args.command == "tensorboard":
            return serve_tensorboard(paths, args)
        ranks = frozenset({args.node}) if args.node is not None else None
        if args.cursor is not None:
            return print_page(efs, args, ranks)
        try:
            job = follow(efs, args.job_id, live=args.follow, prefix=not args.no_prefix,
                         ranks=ranks)
        except KeyboardInterrupt:
            return 0  # stop following; the job is not touched
        if args.follow:
            print(f"[dl-jobs] {final_message(job)}", file=sys.stderr)
            return 0 if job.state == JobState.SUCCEEDED.value else EXIT_FAILED
        return 0
    except managed.ManagedError as exc:
        print(f"dl-jobs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

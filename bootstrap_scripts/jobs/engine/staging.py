"""``dl-run --data``: stage the S3 data on every node before the job, then tell each rank where.

The staging is a job of its own, ``<job-id>.stage``, run through the same engine with the
``each`` launcher: ``python -m bootstrap_scripts.data.stage SOURCE`` once on every node, as
the job's user (the executors start it like any share), with its logs in
``jobs/<job-id>.stage/nodes/``. Only when every node has staged does the job itself start;
a node that cannot stage fails that job, and its error line (the object and the cause) is
the message, before the job ever ran.

Each node reports where it put the data (``DL_STAGE_RESULT`` in its log); the job's ranks
get that directory as ``DL_DATA_DIR``, and ``jobs/<job-id>/staging.json`` records every
node's directory, bytes, seconds and GB/s.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import bootstrap_scripts
from bootstrap_scripts.data.checksums import WARN
from bootstrap_scripts.data.plan import RESULT_MARKER, size_text
from bootstrap_scripts.jobs.engine.outcomes import EXIT_USAGE, RunError, say
from bootstrap_scripts.jobs.engine.plan_types import LaunchPlan
from bootstrap_scripts.protocol import record_base, store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.run_request import RunRequest, StagedNode, StagingReport

#: The staging job's id: the job's, with this suffix.
STAGE_SUFFIX = ".stage"
#: The variable that tells every rank where its node staged the data.
DATA_DIR_VARIABLE = "DL_DATA_DIR"


def stage_request(request: RunRequest, m: Membership) -> RunRequest:
    """The staging job of ``request``: the stager once on each node, with the tools'
    interpreter (it has boto3) and this package first on its path, in ``/`` (nothing in the
    job's directory can shadow the stager's modules)."""
    if request.elastic:
        raise RunError("--data does not go with --elastic yet: a node that joins later "
                       "would start without the data", EXIT_USAGE)
    job_id = request.job_id + STAGE_SUFFIX
    if len(job_id) > 128:
        raise RunError(f"job id {request.job_id!r} is too long for its staging job "
                       f"{job_id!r} (128 characters at most)", EXIT_USAGE)
    package_parent = str(Path(bootstrap_scripts.__file__).resolve().parent.parent)
    env = dict(request.env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", ""))
                                        if p)
    env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-m", "bootstrap_scripts.data.stage", request.data]
    if request.data_shard:
        command += ["--shard-count", str(len(m.nodes))]
    command += ["--checksums", request.data_checksums]
    # No checkpoint restore or mirror of its own: the job's are around the job, not this.
    return replace(request, job_id=job_id, command=tuple(command), launcher="each", env=env,
                   cwd="/", python=sys.executable, data="", data_shard=False,
                   data_checksums=WARN, elastic=False, checkpoint_url="",
                   resume_from="", mounts=())


def stage_results(paths: JobPaths, m: Membership) -> dict[int, dict]:
    """rank -> the stager's result record, from each node's log of the staging job."""
    out: dict[int, dict] = {}
    for node in m.nodes:
        with contextlib.suppress(OSError):
            for line in paths.log(node.rank).read_text(errors="replace").splitlines():
                marker, _, body = line.strip().partition(" ")
                if marker == RESULT_MARKER:
                    with contextlib.suppress(ValueError):
                        out[node.rank] = record_base.loads(body)
    return out


def report(request: RunRequest, m: Membership, paths: JobPaths, seconds: float
           ) -> StagingReport:
    """The job's staging record; RunError if a node that succeeded left no result."""
    results = stage_results(paths, m)
    missing = [n.rank for n in m.nodes if n.rank not in results]
    if missing:
        raise RunError(f"staging {request.data}: node rank(s) {missing} reported no result "
                       f"(logs: {paths.nodes})")
    nodes = []
    for n in m.nodes:
        r = results[n.rank]
        try:
            nodes.append(StagedNode(
                rank=n.rank, address=n.address, directory=str(r["directory"]),
                objects=int(r["objects"]), copied=int(r["copied"]), bytes=int(r["bytes"]),
                copied_bytes=int(r["copied_bytes"]), seconds=float(r["seconds"]),
                gbps=float(r["gbps"]), shard=str(r.get("shard", "")),
                unverified=int(r.get("unverified", 0))))
        except (KeyError, TypeError, ValueError) as exc:
            raise RunError(f"staging {request.data}: node rank {n.rank} reported a malformed "
                           f"result ({exc!r}; logs: {paths.nodes})") from None
    return StagingReport(job_id=request.job_id, source=request.data,
                         seconds=round(seconds, 3), nodes=tuple(nodes))


def with_data_dir(plan: LaunchPlan, staged: StagingReport, request: RunRequest
                  ) -> tuple[LaunchPlan, RunRequest]:
    """Every rank learns its node's data directory (``DL_DATA_DIR``): in the job's
    environment when all nodes agree (mpirun forwards it to the ranks it starts), and in
    each node's share otherwise (per-node launchers only)."""
    dirs = {n.address: n.directory for n in staged.nodes}
    if len(set(dirs.values())) == 1:
        (directory,) = set(dirs.values())
        env = {**request.env, DATA_DIR_VARIABLE: directory}
        forward = tuple(dict.fromkeys((*request.forward, DATA_DIR_VARIABLE)))
        request = replace(request, env=env, forward=forward)
    elif plan.master_only:
        raise RunError(f"the nodes staged {request.data} to different directories "
                       f"({', '.join(sorted(set(dirs.values())))}) and the {plan.launcher} "
                       f"launcher starts every rank from the master: give one directory "
                       f"for all, --data {request.data}:/local/dir", EXIT_USAGE)
    shares = tuple(replace(s, procs=tuple(
        replace(p, env={**p.env, DATA_DIR_VARIABLE: dirs[s.address]})
        for p in s.procs)) if s.address in dirs else s
        for s in plan.shares)
    return replace(plan, shares=shares), request


def announce(staged: StagingReport) -> None:
    total = sum(n.copied_bytes for n in staged.nodes)
    say(f"data {staged.source} staged on {len(staged.nodes)} node(s) in {staged.seconds:.1f} s "
        f"({size_text(total)} copied; " + ", ".join(
            f"rank {n.rank}: {n.gbps:.2f} GB/s" for n in staged.nodes) + ")")
    if unverified := sum(n.unverified for n in staged.nodes):
        say(f"data {staged.source}: {unverified} object(s) staged without a checksum check "
            f"(why, and what to do: the staging job {staged.job_id}{STAGE_SUFFIX}'s node "
            f"logs)")


@contextlib.contextmanager
def cancel_forwarded(job: JobPaths, stage: JobPaths, poll: float = 0.5) -> Iterator[None]:
    """While the staging runs: a cancel of the job (the job controller writes the job's
    ``cancel`` marker, ``dl-jobs cancel``) cancels the staging job too."""
    done = threading.Event()

    def forward() -> None:
        while not done.wait(poll):
            if store.exists(job.cancel):
                with contextlib.suppress(OSError, ProtocolError):
                    store.atomic_write(stage.cancel, store.read_text(job.cancel) or
                                       "the job was cancelled while staging its data\n")
                return

    thread = threading.Thread(target=forward, daemon=True, name="stage-cancel")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)

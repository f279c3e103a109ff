"""An image job's pull on every node before any rank starts (``<job-id>.pull``).

A job with ``--image`` (pinned to its digest at submit: ``containers/resolve.py``) first
runs ``dl-container pull IMAGE@DIGEST`` once on every node of the job, through the same
engine with the ``each`` launcher, like the staging of ``--data`` (``staging.py``). The
executors start it as the job's user, so it fills the rootless store the ranks read, on
all nodes at once; its logs are ``jobs/<user>/<job-id>.pull/nodes/``, and the runner prints
every line of them with its node's prefix (a managed job's runner into the attempt's log:
``dl-jobs logs``, ``dlc logs``). An image already in a node's store is not fetched again,
so a second job (or a restart) with the same digest pulls nothing.

Its environment is fixed here (:func:`pull_request`): none of the job's variables, only
the path to this package; ``dl-container pull`` then gives podman a fixed environment of
its own (``containers/pull.py``). Root runs none of it.

A node that cannot pull fails the job before any of its ranks starts. The failure is the
cluster's, never the job's code: ``infrastructure`` (``image-pull``), naming the node and
the cause, which ``dl-container pull`` gives by its exit status (``containers/causes.py``:
not found, access denied, disk full, registry unreachable, throttled), read from the
node's exit record, not from a log.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import bootstrap_scripts
from bootstrap_scripts.containers import causes
from bootstrap_scripts.data.checksums import WARN
from bootstrap_scripts.jobs.engine.classify import Failure, FailureKind
from bootstrap_scripts.protocol.records import JobResult, ShareExit
from bootstrap_scripts.protocol.run_request import RunRequest

#: The pull job's id: the job's, with this suffix.
PULL_SUFFIX = ".pull"
#: The command's module (``dl-container``), run with the tools' interpreter.
MODULE = "bootstrap_scripts.containers.run"


def pull_request(request: RunRequest) -> RunRequest:
    """The pull job of ``request`` (which has a pinned image): ``dl-container pull`` once on
    each node, in ``/``, with this package first on its path and nothing else of the job's
    environment; no data, mounts, checkpoints or image of its own."""
    package_parent = str(Path(bootstrap_scripts.__file__).resolve().parent.parent)
    return replace(request, job_id=request.job_id + PULL_SUFFIX,
                   command=(sys.executable, "-m", MODULE, "pull", request.image),
                   launcher="each", env={"PYTHONPATH": package_parent,
                                         "PYTHONUNBUFFERED": "1"},
                   forward=(), cwd="/", python=sys.executable, nnodes="", elastic=False,
                   join_admission=False, data="", data_shard=False, data_checksums=WARN,
                   checkpoint_url="", resume_from="", mounts=(), hang_timeout=0.0, image="")


def is_pull_job(job_id: str) -> bool:
    return job_id.endswith(PULL_SUFFIX)


#: what every node answering alike says of the image, not of a node: the job's input
FINAL_CAUSES = (causes.NOT_FOUND, causes.ACCESS_DENIED)


def node_cause(exit_rec: ShareExit | None) -> str:
    """The cause a node's ``dl-container pull`` gave by its exit status."""
    if exit_rec is None:
        return "the node's pull never ended (node lost)"
    if exit_rec.returncode < 0:
        return f"the pull was killed by signal {-exit_rec.returncode}"
    return causes.CAUSE_OF_EXIT.get(exit_rec.returncode,
                                    f"{causes.OTHER} (exit status {exit_rec.returncode})")


def pull_failure(failure: Failure | None, result: JobResult | None,
                 exits: Mapping[int, ShareExit], image: str = "") -> Failure | None:
    """A failed pull job's failure as the job's: ``infrastructure`` (``image-pull``), naming
    every node that could not pull and its cause, retried like a node fault; but when every
    node was told the image is not there or not theirs to read (:data:`FINAL_CAUSES`), the
    job's ``input``, retried no more than its code (the same answer would come again). A
    cancel stays a cancel; a pull that succeeded is no failure."""
    if failure is None or failure.kind is FailureKind.CANCELLED:
        return failure
    nodes = [n for n in (result.nodes if result is not None else ())
             if n.returncode != 0 and not n.left]
    failed = [n for n in nodes if n.returncode is not None and
              not (exits.get(n.rank) and exits[n.rank].cancelled)] or nodes
    what = f"pulling {image}" if image else "pulling the job's image"
    if not failed:
        return Failure(FailureKind.IMAGE_PULL, f"{what} failed: {failure.detail}",
                       failure.address, rank=failure.rank)
    detail = "; ".join(f"node rank {n.rank} ({n.address}): {node_cause(exits.get(n.rank))}"
                       for n in failed)
    first = failed[0]
    everyone = result is not None and len(failed) == len(result.nodes)
    if everyone and all(node_cause(exits.get(n.rank)) in FINAL_CAUSES for n in failed):
        # every node got the same answer about the image itself: a retry would get it too
        return Failure(FailureKind.INPUT, f"{what} failed on every node ({detail}): the "
                       "image cannot be pulled as it is named; not retried", first.address,
                       rank=first.rank)
    return Failure(FailureKind.IMAGE_PULL, f"{what} failed on {detail}", first.address,
                   rank=first.rank)


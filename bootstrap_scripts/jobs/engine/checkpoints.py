"""A job's checkpoints in S3: restored before it starts, mirrored while it runs, flushed after.

For a job with a checkpoint directory (``DL_CHECKPOINT_DIR`` in its environment: every
managed job's) and a mirror URL (``RunRequest.checkpoint_url``, which the job controller
sets to ``s3://<checkpoint bucket>/checkpoints/<cluster-id>/<user>/<job-id>/``) or a
``--resume-from`` URL, the engine runs ``bootstrap_scripts.data.checkpoint_mirror``:

1. **restore**: the job ``<job-id>.restore`` on the job's first node only (one writer on
   EFS), before the job: the newest complete checkpoint of the directory, the mirror and
   ``--resume-from`` is made present in the directory (fetched when it is in S3). A restore
   that fails fails the job before it starts, naming the cause.
2. **mirror**: a helper process (``wait=False``, label ``ckpt-mirror``) of the job's share on
   its first node, uploading each complete checkpoint as it appears. A job that writes each
   checkpoint to a node-local directory first (``DL_CHECKPOINT_LOCAL_DIR``: the example job
   does, given one) has it uploaded from there where that node holds it, so EFS is not read
   back (``--local``; docs/data.md, "What a checkpoint costs on EFS").
3. **flush**: the job ``<job-id>.flush`` on the same node once the job has ended (the
   executor stops helpers at once when a job's main processes end, so the last checkpoint
   may not be mirrored yet): one last pass. Its failure is reported, not the job's.

Each of them is a process of a share, so it runs as the job's user with the job's own
credentials (the job role's), never root's; the sub-jobs are ordinary jobs of the engine
(logs in ``jobs/<job-id>.restore/nodes/``), like ``--data``'s staging job.

Where a job's newest complete checkpoint is (:func:`checkpoint_position` for the controller's
resume, :func:`last_checkpoint` for ``dl-jobs``) is read here too, by the same rule of what a
checkpoint is (``data/checkpoint_plan.py``).
"""

from __future__ import annotations

import os
import pwd
import sys
from dataclasses import replace
from pathlib import Path

import bootstrap_scripts
from bootstrap_scripts.data.checkpoint_mirror import local_listing, read_local, read_status
from bootstrap_scripts.data.checkpoint_plan import survey
from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.engine.outcomes import EXIT_USAGE, RunError
from bootstrap_scripts.jobs.engine.plan_types import LaunchPlan
from bootstrap_scripts.protocol import record_base
from bootstrap_scripts.protocol.jobs import Proc
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.run_request import RunRequest

#: The variable naming a job's checkpoint directory (a managed job's: ``attempts``).
DIR_VARIABLE = "DL_CHECKPOINT_DIR"
#: The variable naming a node-local directory where the job writes each checkpoint first
#: (the same files and manifest): the mirror reads it instead of EFS.
LOCAL_VARIABLE = "DL_CHECKPOINT_LOCAL_DIR"
#: The variable telling the ranks where their checkpoints are mirrored.
URL_VARIABLE = "DL_CHECKPOINT_URL"
MIRROR_LABEL = "ckpt-mirror"
RESTORE_SUFFIX, FLUSH_SUFFIX = ".restore", ".flush"
MODULE = "bootstrap_scripts.data.checkpoint_mirror"


def wanted(request: RunRequest) -> bool:
    """Does this job restore, mirror or flush checkpoints? RunError (usage) when it asks
    to but has no checkpoint directory."""
    if not (request.checkpoint_url or request.resume_from):
        return False
    if not request.env.get(DIR_VARIABLE):
        raise RunError(f"--resume-from {request.resume_from or request.checkpoint_url!r} "
                       f"needs a checkpoint directory to resume in: a managed job's "
                       f"(dl-run without --unmanaged), or --env {DIR_VARIABLE}=DIR",
                       EXIT_USAGE)
    return True


def tool_env(request: RunRequest) -> dict[str, str]:
    """The tool's own additions: this package first on its path (the tools' interpreter
    has boto3), unbuffered lines."""
    parent = str(Path(bootstrap_scripts.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (parent, request.env.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def tool_argv(action: str, request: RunRequest) -> list[str]:
    argv = [sys.executable, "-m", MODULE, action, "--dir", request.env[DIR_VARIABLE],
            "--url", request.checkpoint_url or request.resume_from]
    if action == "restore" and request.checkpoint_url and request.resume_from:
        argv += ["--from", request.resume_from]
    if action != "restore" and request.env.get(LOCAL_VARIABLE):
        argv += ["--local", request.env[LOCAL_VARIABLE]]
    return argv


def sub_request(request: RunRequest, action: str, suffix: str) -> RunRequest:
    """``request``'s restore or flush job: the tool once, on one node, in ``/``."""
    job_id = request.job_id + suffix
    if len(job_id) > 128:
        raise RunError(f"job id {request.job_id!r} is too long for its checkpoint job "
                       f"{job_id!r} (128 characters at most)", EXIT_USAGE)
    return replace(request, job_id=job_id, command=tuple(tool_argv(action, request)),
                   launcher="each", env={**request.env, **tool_env(request)}, cwd="/",
                   python=sys.executable, data="", data_shard=False, elastic=False,
                   checkpoint_url="", resume_from="")


def restore_request(request: RunRequest) -> RunRequest:
    return sub_request(request, "restore", RESTORE_SUFFIX)


def flush_request(request: RunRequest) -> RunRequest | None:
    return sub_request(request, "once", FLUSH_SUFFIX) if request.checkpoint_url else None


def first_node(m: Membership) -> list:
    """The node the restore, mirror and flush run on: the job's first (lowest rank)."""
    return [min(m.nodes, key=lambda n: n.rank)]


def with_mirror(plan: LaunchPlan, request: RunRequest) -> tuple[LaunchPlan, RunRequest]:
    """The mirror as a helper of the first share, and ``DL_CHECKPOINT_URL`` for the ranks
    (informational: they write to the directory, the mirror does the rest)."""
    if not request.checkpoint_url or not plan.shares:
        return plan, request
    first = min(plan.shares, key=lambda s: s.rank)
    helper = Proc(argv=tuple(tool_argv("watch", request)), env=tool_env(request),
                  label=MIRROR_LABEL, wait=False)
    shares = tuple(replace(s, procs=(*s.procs, helper)) if s is first else s
                   for s in plan.shares)
    env = {**request.env, URL_VARIABLE: request.checkpoint_url}
    forward = tuple(dict.fromkeys((*request.forward, URL_VARIABLE)))
    return replace(plan, shares=shares), replace(request, env=env, forward=forward)


def checkpoint_position(ckdir: Path) -> tuple[int | None, int | None]:
    """(epoch, step) of the newest complete checkpoint in ``ckdir``: its manifest's ``meta``
    (``data/checkpoint_plan.py``), else ``<ckdir>/latest.json`` (the example job's pointer
    to its newest checkpoint); (None, None) when there is none."""
    newest = survey(*local_listing(ckdir)).newest
    try:
        info = newest.meta if newest is not None else record_base.loads(
            read_local(ckdir / "latest.json"), source=str(ckdir / "latest.json"))
        return int(info["epoch"]), int(info["step"])
    except (OSError, ValueError, KeyError, TypeError, ArithmeticError):
        # none, or no regular file of text (a FIFO is never waited on), or not a position
        return None, None


def last_checkpoint(efs: Path, job: ManagedJob) -> dict[str, str]:
    """Where job ``job``'s newest complete checkpoint is: ``efs`` (its manifest in the job's
    checkpoint directory) and ``s3`` (the manifest the mirror last uploaded), "" where there
    is none or the directory is not ours to read. Root reads it as the job's user: the
    directory is theirs and may hold a link."""
    ckdir = ClusterPaths(efs).user_checkpoints(job.user) / job.job_id if job.user else None
    if ckdir is None:
        return {"efs": "", "s3": ""}
    try:
        uid, gid = pwd.getpwnam(job.user).pw_uid, pwd.getpwnam(job.user).pw_gid
    except KeyError:
        uid = gid = -1
    with userfiles.as_user(uid, gid):
        newest = survey(*local_listing(ckdir)).newest
        mirrored = str(read_status(ckdir).get("manifest", ""))
    return {"efs": str(ckdir / newest.manifest_file) if newest else "",
            "s3": mirrored if mirrored.startswith("s3://") else ""}

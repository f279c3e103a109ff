"""Managed jobs on EFS: submitting, listing, cancelling, and reading their records.

A managed job is ``<EFS>/managed/<user>/<job-id>/`` (``protocol.paths.ManagedPaths``): the user's
``request.json`` (written last by ``dl-run``, so its appearance is the submission, and its
owner is the user the job runs as), the controller's ``job.json`` and a ``cancel`` marker.
Everything lives on EFS so that the controller of a replacement master continues where the
previous one stopped, and ``dl-jobs`` can run on any node. Where a job's newest checkpoint
is (``dl-jobs``, the controller's resume) is read by ``engine.checkpoints``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.jobs.engine import controller_records, root_jobs, user_dirs, userfiles
from bootstrap_scripts.jobs.engine.restart_policy import JobState
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import USER_CANCEL_REASON
from bootstrap_scripts.protocol.managed_records import (
    ControllerHeartbeat,
    IdleStopRecord,
    ManagedJob,
    ManagedRequest,
)
from bootstrap_scripts.protocol.paths import ClusterPaths, ManagedPaths

LOG = logging.getLogger("dl-managed")

#: A controller heartbeat older than this means no controller is running.
CONTROLLER_TIMEOUT = 10.0


class ManagedError(Exception):
    """A managed-job operation failed; the message names the job and what exists."""


def submit(efs: Path, request: ManagedRequest,
           prepare: Callable[[ManagedPaths], None] | None = None,
           sign: root_jobs.Sign | None = None) -> ManagedPaths:
    """Create ``managed/<user>/<id>/`` (the caller's own directory, made by root:
    ``user_dirs.own_dir``), let ``prepare`` fill it (e.g. the job's unpacked working
    directory; the directory is removed again if it fails), and write the request last
    (the controller's go). ``sign``: root's signer on the master (``root_jobs``): the
    controller starts root's requests only with the master's signature."""
    try:
        mine = user_dirs.own_dir(ClusterPaths(efs).managed_dir)
    except user_dirs.UserDirError as exc:
        raise ManagedError(str(exc)) from None
    paths = ClusterPaths(efs).managed(request.job_id, mine.name)
    try:
        paths.dir.mkdir(mode=0o755)
    except FileExistsError:
        raise ManagedError(f"job {request.job_id} already exists ({paths.dir}): choose "
                           f"another --job-id") from None
    if prepare is not None:
        try:
            prepare(paths)
        except BaseException:
            shutil.rmtree(paths.dir, ignore_errors=True)
            raise
    text = request.to_json()
    try:
        root_jobs.sign_before(paths.request, text, sign)
    except root_jobs.RootJobError as exc:  # nothing submitted: leave nothing behind
        shutil.rmtree(paths.dir, ignore_errors=True)
        raise ManagedError(str(exc)) from None
    store.atomic_write(paths.request, text, mode=store.OWNER_ONLY)  # its --env values
    return paths


def load_request(paths: ManagedPaths) -> ManagedRequest | None:
    """The user's request, never read through a link nor from another owner's file
    (``userfiles``): root reads it too (the controller, an operator's ``dl-jobs``)."""
    return userfiles.read_record_or_none(paths.request, ManagedRequest)


def request_problem(paths: ManagedPaths) -> str:
    """Why the job's ``request.json`` cannot be used ("" when it can, or is not there)."""
    try:
        userfiles.read_record(paths.request, ManagedRequest)
    except (ProtocolError, UnicodeDecodeError) as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {paths.request}: {exc.strerror or exc}"
    return ""


def root_problem(paths: ManagedPaths, verify: root_jobs.Verify | None) -> str | None:
    """Why root must not start this job ("" when it may): a request of root's needs the
    master's signature (``root_jobs``); a user's request is theirs to run as them. None
    when KMS cannot be asked now (look again at the next pass)."""
    if verify is None:
        return ""
    try:
        owned = userfiles.read_owned(paths.dir, paths.request.name)
    except OSError:
        return ""  # request_problem says why it cannot be read
    try:
        return root_jobs.refusal(paths.dir, paths.request.name, owned.text, owned.uid, verify)
    except Exception as exc:  # MembershipKeyError: KMS unreachable, throttled
        LOG.warning("job %s: cannot check root's request now: %s", paths.key, exc)
        return None


def checked_request(paths: ManagedPaths, verify: root_jobs.Verify | None
                    ) -> tuple[ManagedRequest | None, str | None]:
    """(the request, why root must not start it: "" when it may, None when KMS cannot be
    asked now), from ONE read: the signature is checked over the very bytes that are
    parsed. Read twice (once to parse, once to check), root on a worker could swap a
    forged request in for the parse and the signed one back for the check. (None, "")
    when there is no usable request (``request_problem`` says why)."""
    try:
        owned = userfiles.read_owned(paths.dir, paths.request.name)
        request = ManagedRequest.from_json(owned.text, source=str(paths.request))
    except (OSError, ProtocolError, UnicodeDecodeError):
        return None, ""
    if verify is None:
        return request, ""
    try:
        problem = root_jobs.refusal(paths.dir, paths.request.name, owned.text, owned.uid,
                                    verify)
    except Exception as exc:  # MembershipKeyError: KMS unreachable, throttled
        LOG.warning("job %s: cannot check root's request now: %s", paths.key, exc)
        return request, None
    return request, problem


def unusable(paths: ManagedPaths, problem: str) -> ManagedJob:
    """The record of a job whose request cannot be read: failed, saying why. (A queued
    job must not vanish from ``dl-jobs`` because its request is garbled.)"""
    try:
        at = paths.request.lstat().st_mtime  # the name's own time: a link is not followed
    except OSError:
        at = 0.0
    return ManagedJob(job_id=paths.dir.name, state=JobState.FAILED.value, submitted_at=at,
                      finished_at=at, message=f"request.json is unusable: {problem}")


def load_job(paths: ManagedPaths) -> ManagedJob | None:
    """The controller's record, which it writes as the job's user: read like every file of
    theirs (a link, or another user's file, is no record; one of root's, as an older
    controller wrote it, still is)."""
    return userfiles.read_record_or_none(paths.record, ManagedJob, root_too=True)


def controller_copy(paths: ManagedPaths) -> ManagedJob | None:
    """What ``dl-jobs`` shows of a job the controller picked up: its copy in root's
    ``cluster/managed/`` (``controller_records``), which the job's user cannot rewrite as
    they can ``job.json`` (shown, unchecked: checking needs KMS, which users cannot reach)."""
    try:
        path = ClusterPaths(paths.dir.parents[2]).controller_job(paths.key)
    except (IndexError, ValueError):
        return None
    return userfiles.read_record_or_none(path, ManagedJob, root_too=True)


def save_job(paths: ManagedPaths, job: ManagedJob) -> ManagedJob:
    """Write the controller's record in the job's directory as the directory's owner (the
    job's user; ``userfiles.as_owner_of``), also for a job whose request cannot be used:
    root never writes through whatever the user left at that name."""
    job = ManagedJob.from_dict({**job.to_dict(), "updated_at": time.time()})
    with userfiles.as_owner_of(paths.dir):
        store.write_record(paths.record, job)
    return job


#: The message of a job cancelled before the controller picked it up.
CANCELLED_BEFORE_START = "cancelled by the user before it started"


def view(paths: ManagedPaths) -> ManagedJob | None:
    """The controller's record, or (not picked up yet) a queued view of the request:
    cancelled if the user cancelled it. The controller closes such a job only when it
    next takes one from the queue, which may be after a long job ends; until then the
    job is over for everyone reading it (``dl-jobs``, ``dlc logs -f``)."""
    job = controller_copy(paths) or load_job(paths)
    if job is not None:
        return job
    req = load_request(paths)
    if req is None:
        problem = request_problem(paths)
        return unusable(paths, problem) if problem else None
    cancelled = cancel_requested(paths)
    return ManagedJob(job_id=req.job_id,
                      state=(JobState.CANCELLED if cancelled else JobState.QUEUED).value,
                      submitted_at=req.submitted_at, user=req.user,
                      world_size=req.world_size, full_size=req.world_size,
                      max_cost_usd=req.max_cost_usd,
                      message=CANCELLED_BEFORE_START if cancelled else "")


def all_paths(efs: Path) -> list[ManagedPaths]:
    """Every managed job of every user: ``managed/<user>/<id>/`` of the users' own
    directories only (``user_dirs.user_dirs``: the old flat layout is not listed)."""
    out = []
    for _user, root in user_dirs.user_dirs(ClusterPaths(efs).managed_dir):
        try:
            names = sorted(e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)
                           and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            continue
        out += [ManagedPaths(root / name) for name in names]
    return out


def list_jobs(efs: Path) -> list[ManagedJob]:
    """Every managed job (submitted ones only), oldest submission first."""
    jobs = [j for j in (view(p) for p in all_paths(efs)) if j is not None]
    return sorted(jobs, key=lambda j: (j.submitted_at, j.job_id))


def unusable_queued(efs: Path, verify: root_jobs.Verify | None = None
                    ) -> list[tuple[ManagedPaths, str]]:
    """Submitted jobs (``request.json`` there) not picked up yet whose request cannot be
    read, or is root's without the master's signature (``verify``), with why."""
    out = []
    for paths in all_paths(efs):
        if load_job(paths) is None and os.path.lexists(paths.request):
            problem = request_problem(paths) or root_problem(paths, verify)
            if problem:
                out.append((paths, problem))
    return out


def queue(efs: Path, verify: root_jobs.Verify | None = None,
          seal: controller_records.ControllerSeal | None = None
          ) -> list[tuple[ManagedPaths, ManagedRequest]]:
    """Requests waiting to run, first come first served (root's only with the master's
    signature, checked with ``verify``). ``seal``: a job's state is the controller's signed
    record (``controller_records``); the user's ``job.json`` only for a job that has none
    (not picked up yet, or recorded by an older controller); a record that is not the
    master's (logged) or cannot be checked now keeps the job out of this pass."""
    out = []
    for paths in all_paths(efs):
        req, problem = checked_request(paths, verify)
        job = load_job(paths)
        if seal is not None and req is not None:
            found = controller_records.read_job(seal, efs, paths.key)
            if found.trust is not controller_records.Trust.ABSENT:
                job = controller_records.trusted_job(found)
                if job is None:
                    continue
        if req is not None and (job is None or job.state == JobState.QUEUED.value) and \
                problem == "":
            out.append((paths, req))
    return sorted(out, key=lambda pr: (pr[1].submitted_at, pr[1].job_id))


def find(efs: Path, job_id: str, *, mine: str | None = None) -> ManagedPaths:
    """The job's directory, or ManagedError naming the id and listing the jobs there are.
    ``job_id`` is a key ``<user>/<id>`` or a bare id: the caller's own job of that id if
    there is one, else the one user's job of that id (an operator's ``dl-jobs`` runs as
    root); several: ManagedError naming them (``alice/ID``, ``bob/ID``). ``mine``: whose
    directory is the caller's own (default: the caller's user; an operator's document
    runs as root for its operator's user)."""
    try:
        paths = ClusterPaths(efs).managed(job_id, None if "/" in job_id else mine)
        if "/" not in job_id and not os.path.lexists(paths.request):
            found = [p for p in all_paths(efs) if p.job_id == job_id
                     and os.path.lexists(p.request)]
            if len(found) > 1:
                raise ManagedError(f"job id {job_id!r} is several users' jobs: name one of "
                                   + ", ".join(p.key for p in found))
            paths = found[0] if found else paths
    except ValueError as exc:
        raise ManagedError(str(exc)) from None
    if not os.path.lexists(paths.request):
        known = [p.key for p in all_paths(efs) if os.path.lexists(p.request)]
        raise ManagedError(f"no job {job_id!r} under {ClusterPaths(efs).managed_dir}; jobs: "
                           + (", ".join(known[-20:]) if known else "none"))
    return paths


def cancel(efs: Path, job_id: str, *, for_user: str | None = None) -> str:
    """Ask for the job to be cancelled; the running attempt is stopped at once through its
    own cancel file (the executors watch it). Returns what was done, for the user.
    ``for_user``: cancel only a job of this user (:func:`check_owner`), whoever runs this
    (an operator's per-user Command document runs it as root)."""
    paths = find(efs, job_id)
    if for_user is not None:
        check_owner(paths, for_user)
    job = view(paths)
    if job is not None and JobState(job.state).terminal:
        raise ManagedError(f"job {job_id} has already {job.state}: nothing to cancel")
    try:  # as the job's user when root runs this: a marker root wrote would not count
        with userfiles.as_owner_of(paths.dir):
            store.atomic_write(paths.cancel, f"cancelled by {os.getuid()} at "
                                             f"{time.time():.0f}\n")
    except PermissionError:
        raise ManagedError(f"job {job_id} is not yours (cannot write {paths.cancel})") from None
    if job is not None and job.attempt and job.state == JobState.RUNNING.value:
        attempt = ClusterPaths(efs).job(paths.attempt_key(job.attempt))
        with contextlib.suppress(OSError), userfiles.as_owner_of(attempt.dir):
            store.atomic_write(attempt.cancel, f"{USER_CANCEL_REASON} (dl-jobs cancel)\n")
        return f"cancelling job {job_id}: stopping attempt {job.attempt} on every node"
    return f"cancelled job {job_id} ({job.state if job else 'queued'}): it will not run"


def check_owner(paths: ManagedPaths, user: str) -> None:
    """ManagedError unless the job was submitted by ``user``: its ``request.json`` is that
    user's file (owner from ``fstat`` of what was opened without following links, as the
    controller decides whom the job runs as), never what the request says of itself."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ManagedError(f"no user {user} on this node: cannot tell whether job "
                           f"{paths.dir.name} is theirs") from None
    try:
        owner = userfiles.read_owned(paths.dir, paths.request.name).uid
    except OSError as exc:
        raise ManagedError(f"job {paths.dir.name}: its request cannot be read safely "
                           f"({exc}): not cancelled for {user}") from None
    if owner != uid:
        raise ManagedError(f"job {paths.dir.name} is {userfiles.user_name(owner)}'s, not "
                           f"{user}'s: {user}'s operator document cancels only {user}'s jobs "
                           "(an administrator's cancels any)")


def cancel_requested(paths: ManagedPaths) -> bool:
    return userfiles.exists(paths.cancel)


@dataclass(frozen=True)
class ControllerStatus:
    alive: bool
    text: str
    heartbeat: ControllerHeartbeat | None


def controller_status(efs: Path, timeout: float = CONTROLLER_TIMEOUT) -> ControllerStatus:
    """Is a job controller running (its heartbeat fresh)? With a sentence for humans."""
    path = ClusterPaths(efs).controller_heartbeat
    hb = store.read_record_or_none(path, ControllerHeartbeat)
    if hb is None:
        return ControllerStatus(False, f"no job controller has ever run here (no {path})", None)
    age = time.time() - hb.heartbeat
    where = f"pid {hb.pid} on {hb.instance_id or hb.hostname}"
    if hb.state == "stopped":
        return ControllerStatus(False, f"job controller stopped {age:.0f} s ago ({where})", hb)
    if age > timeout:
        return ControllerStatus(False, f"job controller NOT RUNNING: last heartbeat {age:.0f} s "
                                f"ago ({where})", hb)
    return ControllerStatus(True, f"job controller alive ({where}, {age:.1f} s ago)", hb)


def idle_stop(efs: Path) -> IdleStopRecord | None:
    """The job controller's idle-stop record (``jobs.controller.idle``); None if none yet."""
    return store.read_record_or_none(ClusterPaths(efs).idle_stop, IdleStopRecord)


def idle_text(rec: IdleStopRecord | None, when: Callable[[float | None], str]) -> str:
    """The idle stop in one sentence (``dl-jobs``, ``dl-run``; ``dlc status`` has its own
    from the same record): ``when`` formats a time."""
    if rec is None:
        return "idle stop: no record yet"
    if rec.stopped_at is not None:
        stopped = "STOPPING" if rec.state == "stopping" else "STOPPED"
        text = (f"idle stop: workers {stopped} at {when(rec.stopped_at)} (idle since "
                f"{when(rec.idle_since)}); the next job scales them back to "
                f"{rec.desired_before}")
    elif rec.state == "idle":
        text = (f"idle stop: idle since {when(rec.idle_since)}, workers stop at "
                f"{when(rec.stop_at)}")
    elif rec.state == "disabled" or rec.idle_seconds <= 0:
        text = "idle stop: off (idleStopMinutes 0)"
    else:
        text = (f"idle stop: not idle; workers stop {rec.idle_seconds / 60:g} min after the "
                f"last job")
    return text + (f" [{rec.message}]" if "failed" in rec.message else "")

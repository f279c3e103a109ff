"""A job's own AWS credentials: the cluster's job role, never the node's instance role.

WHY: the node's instance role can scale the cluster, read the queues and mount EFS as root;
a job (the least trusted code on the cluster) must not hold it, so instance metadata is
closed to every user but root (docs/security.md). A job that needs AWS (its data and
checkpoints in S3) gets temporary credentials of the stack's *job role* instead, the way
ECS hands a task its task role:

- the executor (root, with the instance role's credentials) calls ``sts:AssumeRole`` on the
  job role for each job it starts, tagging the session with the job's user
  (``dl-user``): the job role's policy scopes what the session may touch to that user's own
  prefixes with ``${aws:PrincipalTag/dl-user}`` (attribute-based access control,
  https://docs.aws.amazon.com/IAM/latest/UserGuide/id_session-tags.html);
- the credentials are written on the node's local disk (never on EFS), in a directory only
  root may change, readable only by the job's user (0600, owned by the user);
- the job finds them through the SDKs' standard setting: ``AWS_CONFIG_FILE`` names a
  profile whose ``credential_process`` prints them
  (https://docs.aws.amazon.com/sdkref/latest/guide/feature-process-credentials.html); the
  SDKs run it again before the ``Expiration`` it reports, and the executor rewrites the file
  well before then (a role assumed with another role's credentials lasts at most one hour:
  https://docs.aws.amazon.com/IAM/latest/UserGuide/id_roles_use.html#id_roles_use_view-role-max-session).

The node's own credentials never reach the job's environment: the executor removes every
``AWS_*`` credential variable from it and turns the SDKs' metadata lookup off.

No call to STS runs in the executor's loop (it writes the node's heartbeat): the executor
starts the call (:meth:`JobCredentialStore.begin`) on a thread (``aws_calls.py``), starts the
share only once the call has ended (:meth:`JobCredentialStore.collect`), and renews the
credentials of running jobs the same way (:meth:`JobCredentialStore.refresh_due`). A call
AWS does not answer within :data:`WAIT_SECONDS` is an outage (``CredentialsError.outage``):
the share is not started and its exit says so, an infrastructure fault, never the node's
nor the job's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bootstrap_scripts.jobs.executor.aws_calls import Calls, Outage

LOG = logging.getLogger("dl-executor")

#: Seconds a job role session lasts (the most role chaining allows).
SESSION_SECONDS = 3600
#: Rewrite a job's credentials when they have less than this left.
REFRESH_BEFORE_SECONDS = 20 * 60
#: How long a share waits for its job's credentials before AWS's silence is called an
#: outage: below the runner's default ``--start-timeout`` (30 s), so the runner reads the
#: share's own exit (the outage named) rather than a node that never started its share.
WAIT_SECONDS = 15.0
#: The session tag the job role's policy scopes by.
USER_TAG = "dl-user"
#: Environment variables that would hand a job credentials other than its own.
STRIPPED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
            "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
            "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_ROLE_ARN",
            "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SESSION_CHARS = re.compile(r"[^\w+=,.@-]")


class CredentialsError(RuntimeError):
    """The job's credentials could not be made (STS refused, a bad job id, a disk error);
    ``outage``: AWS did not answer (``aws_calls.is_outage``), nobody's fault on the node."""

    def __init__(self, message: str, *, outage: bool = False) -> None:
        super().__init__(message)
        self.outage = outage


@dataclass(frozen=True)
class JobCredentials:
    """Where one job's credentials live on this node and when they expire."""

    directory: Path
    expiration: float

    @property
    def config_file(self) -> Path:
        return self.directory / "config"

    @property
    def credentials_file(self) -> Path:
        return self.directory / "credentials.json"

    @property
    def mount_config_file(self) -> Path:
        """Root's own copy of the config, for the job's S3 mounts (``s3_mounts.py``):
        mount-s3 runs as root and must not read a file the job's user can rewrite."""
        return self.directory / "mount-config"

    @property
    def mount_credentials_file(self) -> Path:
        return self.directory / "mount-credentials.json"


def session_name(user: str, job_id: str) -> str:
    """``dl-<user>-<job>`` in the characters and length STS accepts (CloudTrail shows it):
    the job's user and id, so two users' jobs of the same id have sessions of their own
    (``job_id`` may be a key ``<user>/<job-id>``: its id is used)."""
    return _SESSION_CHARS.sub("-", f"dl-{user}-{job_id.rpartition('/')[2]}")[:64]


def job_env(base: dict[str, str], creds: JobCredentials | None) -> dict[str, str]:
    """``base`` without any credentials of the node's, plus the job's own (if any)."""
    env = {k: v for k, v in base.items() if k not in STRIPPED}
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # closed to jobs anyway: fail fast, not slowly
    if creds is not None:
        env["AWS_CONFIG_FILE"] = str(creds.config_file)
        env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    return env


def render_config(credentials_file: Path, region: str) -> str:
    """The job's AWS config: one default profile that prints the credentials file."""
    lines = ["[default]", f"credential_process = /bin/cat {shlex.quote(str(credentials_file))}"]
    if region:
        lines.append(f"region = {region}")
    return "\n".join(lines) + "\n"


def process_output(response: dict[str, Any]) -> dict[str, Any]:
    """STS's ``Credentials`` in the ``credential_process`` format (Version 1)."""
    c = response["Credentials"]
    expiration = c["Expiration"]
    text = expiration.isoformat() if hasattr(expiration, "isoformat") else str(expiration)
    return {"Version": 1, "AccessKeyId": c["AccessKeyId"],
            "SecretAccessKey": c["SecretAccessKey"], "SessionToken": c["SessionToken"],
            "Expiration": text}


class JobCredentialStore:
    """The credentials of the jobs running on this node, under one root-owned directory.

    ``base`` (``<root>/var/lib/dl-agent/job-credentials``) and each job's directory in it
    are root's, 0711: the job's user may read the files it is given by name, but neither
    list, add, remove nor replace anything, so root never meets a link a user planted."""

    def __init__(self, base: Path, role_arn: str, region: str,
                 sts: Callable[[], Any], clock: Callable[[], float] = time.time) -> None:
        self.base, self.role_arn, self.region = base, role_arn, region
        self.sts, self.clock = sts, clock
        self.jobs: dict[str, JobCredentials] = {}
        #: STS calls under way on their threads, and whose each one is (user, uid, gid)
        self.calls = Calls()
        self.owners: dict[str, tuple[str, int, int]] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.role_arn)

    def job_dir(self, job_id: str) -> Path:
        """``<user>.<job-id>`` of a key ``<user>/<job-id>`` (a user name has no dot, so two
        users' jobs never share one)."""
        name = job_id.replace("/", ".", 1)
        if not _JOB_ID.match(name) or "/" in name:
            raise CredentialsError(f"job id {job_id!r} cannot name a credentials directory")
        return self.base / name

    def assume(self, job_id: str, user: str) -> dict[str, Any]:
        """The STS call (the only one): the job role's session for ``user``, in the
        ``credential_process`` format. CredentialsError when STS fails or refuses."""
        try:
            response = self.sts().assume_role(
                RoleArn=self.role_arn, RoleSessionName=session_name(user, job_id),
                DurationSeconds=SESSION_SECONDS, Tags=[{"Key": USER_TAG, "Value": user}])
        except Exception as exc:  # botocore's errors: the message names the call and cause
            raise CredentialsError(f"sts:AssumeRole on the job role {self.role_arn} for job "
                                   f"{job_id} failed: {exc}") from exc
        return process_output(response)

    def install(self, job_id: str, output: dict[str, Any], uid: int, gid: int
                ) -> JobCredentials:
        """Write the session ``output`` for ``uid`` (local disk only, no AWS)."""
        directory = self.job_dir(job_id)
        self._prepare(directory)
        creds = JobCredentials(directory, expiration_of(output))
        _write_private(creds.credentials_file, json.dumps(output), uid, gid)
        _write_private(creds.config_file, render_config(creds.credentials_file, self.region),
                       uid, gid)
        # The same session for the job's S3 mounts, in files only root may read or change.
        _write_private(creds.mount_credentials_file, json.dumps(output), os.geteuid(),
                       os.getegid())
        _write_private(creds.mount_config_file,
                       render_config(creds.mount_credentials_file, self.region),
                       os.geteuid(), os.getegid())
        self.jobs[job_id] = creds
        return creds

    def issue(self, job_id: str, user: str, uid: int, gid: int) -> JobCredentials | None:
        """Assume the job role for ``job_id`` and write its files for ``uid``, waiting for
        STS (never from the executor's loop: :meth:`begin` and :meth:`collect` there);
        None when the cluster has no job role."""
        if not self.enabled:
            return None
        self.job_dir(job_id)  # a bad id fails before AWS is asked
        return self.install(job_id, self.assume(job_id, user), uid, gid)

    def begin(self, job_id: str, user: str, uid: int, gid: int) -> None:
        """Start the STS call for ``job_id`` on its thread (once; nothing without a job
        role): :meth:`settled` says when :meth:`collect` has its answer."""
        if not self.enabled or self.calls.under_way(job_id):
            return
        self.job_dir(job_id)  # a bad id fails here, in the loop, before AWS is asked
        self.owners[job_id] = (user, uid, gid)
        self.calls.start(job_id, lambda: self.assume(job_id, user), WAIT_SECONDS)

    def settled(self, job_id: str) -> bool:
        """Whether :meth:`collect` would return (or raise) now rather than wait."""
        call = self.calls.calls.get(job_id)
        return call is None or call.done.is_set() or \
            self.calls.clock() - call.started > call.wait

    def collect(self, job_id: str) -> JobCredentials | None:
        """The credentials :meth:`begin` asked for, written for their user; None without a
        job role or a call. CredentialsError (``outage`` when AWS did not answer)."""
        if not self.enabled or not self.calls.under_way(job_id):
            return None
        try:
            ended, output = self.calls.poll(job_id)
        except Outage as exc:
            self.owners.pop(job_id, None)
            text = str(exc) if exc.__cause__ is not None else (
                f"sts:AssumeRole on the job role {self.role_arn} for job {job_id}: {exc}")
            raise CredentialsError(text, outage=True) from exc
        except CredentialsError:
            self.owners.pop(job_id, None)
            raise
        if not ended:  # asked before it settled: the caller checks :meth:`settled` first
            raise CredentialsError(f"job {job_id}: its credentials are still being made")
        _user, uid, gid = self.owners.pop(job_id)
        return self.install(job_id, output, uid, gid)

    def refresh_due(self, owners: dict[str, tuple[str, int, int]]) -> list[str]:
        """Renew the credentials of every job in ``owners`` (job id -> user, uid, gid)
        that has less than :data:`REFRESH_BEFORE_SECONDS` left: the call starts on its
        thread, and a later pass writes its answer. Also collects the credentials
        :meth:`begin` asked for a running job (one re-attached). The ids that failed."""
        failed = []
        for job_id, (user, uid, gid) in owners.items():
            if self.calls.under_way(job_id):
                if not self.settled(job_id):
                    continue
                try:
                    self.collect(job_id)
                    LOG.info("job %s: job role credentials renewed", job_id)
                except (CredentialsError, OSError) as exc:
                    LOG.error("job %s: %s", job_id, exc)
                    failed.append(job_id)
                continue
            creds = self.jobs.get(job_id)
            if creds is None or creds.expiration - self.clock() > REFRESH_BEFORE_SECONDS:
                continue
            try:
                self.begin(job_id, user, uid, gid)
            except CredentialsError as exc:
                LOG.error("job %s: %s", job_id, exc)
                failed.append(job_id)
        return failed

    def forget(self, job_id: str) -> None:
        """The job's share ended: its credentials go from the disk."""
        self.jobs.pop(job_id, None)
        self.calls.drop(job_id)
        self.owners.pop(job_id, None)
        with contextlib.suppress(CredentialsError):
            shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def _prepare(self, directory: Path) -> None:
        self.base.parent.mkdir(parents=True, exist_ok=True)
        for d in (self.base, directory):
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o711)
            try:  # what is there, never through a link; its mode set on what was opened
                fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError as exc:
                raise CredentialsError(f"{d} is not a directory of this executor's user: "
                                       f"{exc}") from exc
            try:
                if os.fstat(fd).st_uid != os.geteuid():
                    raise CredentialsError(f"{d} is not a directory of this executor's user")
                os.fchmod(fd, 0o711)
            finally:
                os.close(fd)


def expiration_of(output: dict[str, Any]) -> float:
    """The ``Expiration`` of a ``credential_process`` document as epoch seconds."""
    return datetime.fromisoformat(str(output["Expiration"]).replace("Z", "+00:00")).timestamp()


def _write_private(path: Path, text: str, uid: int, gid: int) -> None:
    """Write ``path`` (in a directory only root may change) for ``uid`` alone, atomically:
    a new file opened exclusively, never through a link, then renamed over the old one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchown(fd, uid, gid)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)

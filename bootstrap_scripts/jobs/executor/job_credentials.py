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

LOG = logging.getLogger("dl-executor")

#: Seconds a job role session lasts (the most role chaining allows).
SESSION_SECONDS = 3600
#: Rewrite a job's credentials when they have less than this left.
REFRESH_BEFORE_SECONDS = 20 * 60
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
    """The job's credentials could not be made (STS refused, a bad job id, a disk error)."""


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

    def issue(self, job_id: str, user: str, uid: int, gid: int) -> JobCredentials | None:
        """Assume the job role for ``job_id`` and write its files for ``uid``; None when the
        cluster has no job role."""
        if not self.enabled:
            return None
        directory = self.job_dir(job_id)
        try:
            response = self.sts().assume_role(
                RoleArn=self.role_arn, RoleSessionName=session_name(user, job_id),
                DurationSeconds=SESSION_SECONDS, Tags=[{"Key": USER_TAG, "Value": user}])
        except Exception as exc:  # botocore's errors: the message names the call and cause
            raise CredentialsError(f"sts:AssumeRole on the job role {self.role_arn} for job "
                                   f"{job_id} failed: {exc}") from exc
        output = process_output(response)
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

    def refresh_due(self, owners: dict[str, tuple[str, int, int]]) -> list[str]:
        """Re-issue the credentials of every job in ``owners`` (job id -> user, uid, gid)
        that has less than :data:`REFRESH_BEFORE_SECONDS` left; the ids that failed."""
        failed = []
        for job_id, (user, uid, gid) in owners.items():
            creds = self.jobs.get(job_id)
            if creds is None or creds.expiration - self.clock() > REFRESH_BEFORE_SECONDS:
                continue
            try:
                self.issue(job_id, user, uid, gid)
                LOG.info("job %s: job role credentials renewed", job_id)
            except (CredentialsError, OSError) as exc:
                LOG.error("job %s: %s", job_id, exc)
                failed.append(job_id)
        return failed

    def forget(self, job_id: str) -> None:
        """The job's share ended: its credentials go from the disk."""
        self.jobs.pop(job_id, None)
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

"""The paths inside one job's directory (``jobs/<user>/<job-id>/``) and one managed job's
(``managed/<user>/<job-id>/``), and the job id every such directory is named by.

Part of :mod:`bootstrap_scripts.protocol.paths` (which re-exports all of it: ask there); kept
apart so that module stays readable. The layout of both directories is in the class
docstrings below and in docs/protocol.md.
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.protocol.errors import ProtocolError

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def validate_job_id(job_id: str) -> str:
    """Job ids become directory names on EFS: no slashes, no dot-files, bounded length."""
    if not JOB_ID_RE.match(job_id):
        raise ProtocolError(
            f"invalid job id {job_id!r}: use letters, digits, '.', '_' or '-' (max 128), "
            "starting with a letter or digit", field="job_id")
    return job_id


#: A Linux user name (useradd's rule) or a bare uid: a directory name, never a path (no
#: ``/``, no ``.``: so ``<user>.<job-id>`` names one user's job unambiguously too).
USER_NAME_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}\$?|[0-9]{1,10}")


def validate_user(user: str) -> str:
    """A user's directory name, never a path."""
    if not USER_NAME_RE.fullmatch(user):
        raise ProtocolError(f"not a user name: {user!r}", field="user")
    return user


def own_user() -> str:
    """The name of the calling process's effective user (its directories' name)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def split_key(ref: str, user: str | None = None) -> tuple[str, str]:
    """``(user, job id)`` of a job reference: a key ``<user>/<job-id>``, or a bare id of
    ``user`` (default: the caller's own user), both validated."""
    if "/" in ref:
        owner, _, job_id = ref.partition("/")
        if user is not None and owner != user:
            raise ProtocolError(f"job {ref!r} is not {user!r}'s", field="job_id")
        return validate_user(owner), validate_job_id(job_id)
    return validate_user(user if user is not None else own_user()), validate_job_id(ref)


def job_key(user: str, job_id: str) -> str:
    """The name of one user's job wherever jobs of several users meet: ``<user>/<job-id>``."""
    return f"{validate_user(user)}/{validate_job_id(job_id)}"


@dataclass(frozen=True)
class UserJobDir:
    """A job's directory in its user's directory, ``<area>/<user>/<job-id>/``: its name,
    its owner's and the two together (the base of :class:`JobPaths` and
    :class:`ManagedPaths`, whose directories are laid out alike)."""

    dir: Path

    @property
    def job_id(self) -> str:
        return self.dir.name

    @property
    def user(self) -> str:
        """The name of the user directory the job is in (its owner's)."""
        return self.dir.parent.name

    @property
    def key(self) -> str:
        """``<user>/<job-id>``: the job's name wherever several users' jobs meet."""
        return f"{self.user}/{self.job_id}"


@dataclass(frozen=True)
class JobPaths(UserJobDir):
    """One job's directory, ``jobs/<user>/<job-id>/`` on EFS::

        spec.json            what to run on which node (written last, atomically: it is the go)
        commands.txt         the resolved per-node commands, for humans
        runner.json          the runner's heartbeat (executors watch it change)
        cancel               marker: stop every share now
        done                 marker: the runner has finished with the job
        result.json          per-node exit codes, as the runner saw them
        staging.json         ``--data``: where and how fast each node staged it
        nodes/<rank>.log     output of the node's share (``<rank>-<label>.log`` if several)
        nodes/<rank>.started the executor's acknowledgement (pids, process group, start time)
        nodes/<rank>.exit    the share's exit
        nodes/<rank>.claim   elastic jobs: a joining node's executor claims rank N (O_EXCL)
        admitted/<address>   elastic attempts of a managed job: the controller's gate passed it
        progress/<rank>.json each rank's progress (``bootstrap_scripts.progress``), its own
        flight/              torch's flight recorder dumps (``TORCH_FR_DUMP_TEMP_FILE``)
        stacks/<rank>.json   a hung rank's Python stack (py-spy, written as the job's user)
    """

    @property
    def spec(self) -> Path:
        return self.dir / "spec.json"

    @property
    def commands(self) -> Path:
        return self.dir / "commands.txt"

    @property
    def runner_heartbeat(self) -> Path:
        return self.dir / "runner.json"

    @property
    def cancel(self) -> Path:
        return self.dir / "cancel"

    @property
    def done(self) -> Path:
        return self.dir / "done"

    @property
    def result(self) -> Path:
        return self.dir / "result.json"

    @property
    def staging(self) -> Path:
        return self.dir / "staging.json"

    @property
    def nodes(self) -> Path:
        return self.dir / "nodes"

    def log(self, rank: int, label: str = "") -> Path:
        if "/" in label or label.startswith("."):  # a word (``jobs.LABEL_RE``), never a path
            raise ProtocolError(f"invalid process label {label!r}", field="label")
        return self.nodes / (f"{int(rank)}-{label}.log" if label else f"{int(rank)}.log")

    def started(self, rank: int) -> Path:
        return self.nodes / f"{rank}.started"

    def exit(self, rank: int) -> Path:
        return self.nodes / f"{rank}.exit"

    def claim(self, rank: int) -> Path:
        return self.nodes / f"{rank}.claim"

    @property
    def admitted_dir(self) -> Path:
        return self.dir / "admitted"

    def admitted(self, address: str) -> Path:
        """Elastic jobs with ``join_admission``: the job controller's word that the node at
        ``address`` passed the health gate and may join (its executor waits for it)."""
        if not address or "/" in address or address.startswith("."):  # a name, never a path
            raise ProtocolError(f"invalid node address {address!r}", field="address")
        return self.admitted_dir / address

    @property
    def progress_dir(self) -> Path:
        """Where the ranks declare their progress (``$DL_PROGRESS_DIR``), one file each."""
        return self.dir / "progress"

    def progress(self, rank: int) -> Path:
        return self.progress_dir / f"{int(rank)}.json"

    @property
    def stacks_dir(self) -> Path:
        return self.dir / "stacks"

    def stack(self, rank: int) -> Path:
        """A hung rank's stack, written by its node's root dump as the job's user."""
        return self.stacks_dir / f"{int(rank)}.json"

    @property
    def flight_dir(self) -> Path:
        """Where torch's flight recorder writes a rank's trace on a watchdog timeout."""
        return self.dir / "flight"


@dataclass(frozen=True)
class ManagedPaths(UserJobDir):
    """One managed job's directory, ``managed/<user>/<job-id>/`` on EFS (made by the
    submitter)::

        request.json                  what the user asked for (ManagedRequest), written last
        job.json                      the controller's record (ManagedJob): state, restarts
        cancel                        marker: the user asked to cancel the job
        attempts/<n>.log              attempt n's runner messages (its ``[dl-run]`` lines)
        attempts/<n>.membership.json  the nodes attempt n runs on, when not the membership's
        attempts/<n>.hang.json        attempt n hung: every rank's step and Python stack
        tensorboard/                  TensorBoard event files (``$DL_TENSORBOARD_DIR``), every
                                      attempt's, written by the ranks as the job's user

    Attempt ``n`` (from 1) is the ordinary job ``jobs/<user>/<job-id>.<n>/``
    (:meth:`attempt_id`, :meth:`attempt_key`).
    """

    @property
    def request(self) -> Path:
        return self.dir / "request.json"

    @property
    def record(self) -> Path:
        return self.dir / "job.json"

    @property
    def cancel(self) -> Path:
        return self.dir / "cancel"

    @property
    def attempts_dir(self) -> Path:
        return self.dir / "attempts"

    def attempt_log(self, n: int) -> Path:
        return self.attempts_dir / f"{n}.log"

    def attempt_membership(self, n: int) -> Path:
        return self.attempts_dir / f"{n}.membership.json"

    def attempt_hang(self, n: int) -> Path:
        return self.attempts_dir / f"{n}.hang.json"

    @property
    def tensorboard_dir(self) -> Path:
        """Where the ranks write TensorBoard event files (``$DL_TENSORBOARD_DIR``): one
        directory for every attempt, so a restarted job's curves continue in one run."""
        return self.dir / "tensorboard"

    def attempt_id(self, n: int) -> str:
        """The job id of attempt ``n``: ``<job-id>.<n>``."""
        return validate_job_id(f"{self.job_id}.{n}")

    def attempt_key(self, n: int) -> str:
        """The key of attempt ``n``: ``<user>/<job-id>.<n>``, the same user's job."""
        return f"{self.user}/{self.attempt_id(n)}"


# -- scanning a job's nodes/ directory (the runner follows logs and joins; an executor its claims)
SHARE_LOG_SUFFIX = ".log"
SHARE_STARTED_SUFFIX = ".started"
SHARE_CLAIM_SUFFIX = ".claim"


def parse_share_file(name: str, suffix: str) -> tuple[int, str] | None:
    """The (rank, label) a ``nodes/`` file name stands for (``3.started`` -> (3, ""),
    ``0-ps.log`` -> (0, "ps")), the inverse of :meth:`JobPaths.log` and friends; None for
    any other name (temp files, other kinds, names without a rank)."""
    if name.startswith(".") or not name.endswith(suffix):
        return None
    rank, _, label = name[: -len(suffix)].partition("-")
    return (int(rank), label) if rank.isdigit() else None

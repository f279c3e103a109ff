"""The per-user directories of ``jobs/``, ``managed/`` and ``checkpoints/`` on EFS.

Each of those is root's (0755); in it each cluster user has one directory, made by root and
handed to the user (:func:`userfiles.user_dir`), in which only that user creates their jobs.
Nobody can take another user's job id, nor plant anything where another user's jobs go:
the directory slot ``jobs/<user>`` is in a directory only root writes.

Root must make a user's directories before that user's first ``dl-run``, so the executor
makes them for every *login user* (:func:`login_users`: root, and every account whose uid is
in ``/etc/login.defs``' ``UID_MIN``..``UID_MAX``, the range ``useradd`` gives people), again
whenever ``/etc/passwd`` changes (:class:`Keeper`: one ``stat`` per pass otherwise). A user
whose directory is missing (created after the executors last looked, or a system account)
gets a clear error from ``dl-run`` (:func:`own_dir`), not a directory of their own making.

Where root lists jobs (executors, the job controller), it lists only the directories named
after a user *and owned by that user* (:func:`user_dirs`): an entry of the old flat layout
(``jobs/<job-id>/``, before per-user directories) is named after a job, not a user, and is
never acted on.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.protocol.paths import PER_USER_DIRS, USER_NAME_RE, own_user

LOG = logging.getLogger("dl-user-dirs")

LOGIN_DEFS = Path("/etc/login.defs")
PASSWD = Path("/etc/passwd")
#: ``useradd``'s defaults when login.defs does not say (shadow-utils)
DEFAULT_UID_RANGE = (1000, 60000)


class UserDirError(Exception):
    """The caller's own job directory cannot be used: missing, or not theirs."""


def uid_range(login_defs: Path = LOGIN_DEFS) -> tuple[int, int]:
    """``UID_MIN``..``UID_MAX`` of ``login.defs`` (useradd's defaults when it says nothing)."""
    low, high = DEFAULT_UID_RANGE
    try:
        lines = login_defs.read_text(errors="replace").splitlines()
    except OSError:
        return low, high
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[1].isdigit():
            if words[0] == "UID_MIN":
                low = int(words[1])
            elif words[0] == "UID_MAX":
                high = int(words[1])
    return low, high


def login_users(login_defs: Path = LOGIN_DEFS) -> dict[str, tuple[int, int]]:
    """``{name: (uid, gid)}`` of root and every account in the login uid range whose name
    can be a directory's (``USER_NAME_RE``)."""
    low, high = uid_range(login_defs)
    return {p.pw_name: (p.pw_uid, p.pw_gid) for p in pwd.getpwall()
            if (p.pw_uid == 0 or low <= p.pw_uid <= high) and USER_NAME_RE.fullmatch(p.pw_name)}


def ensure(efs: Path, users: dict[str, tuple[int, int]]) -> list[str]:
    """Make (or fix) ``<dir>/<user>/`` of every per-user directory for every user, as
    :func:`userfiles.user_dir` does (never through a link, never taking over an entry
    someone else owns). Not root: only the caller's own (a one-user development setup).
    Returns what it refused, for the log; one user's refusal stops nobody else's."""
    if os.geteuid() != 0:
        users = {n: ids for n, ids in users.items() if ids[0] == os.geteuid()}
    refused = []
    for parent, mode in PER_USER_DIRS.items():
        for name, (uid, gid) in sorted(users.items()):
            try:
                userfiles.user_dir(efs / parent, uid, gid, mode)
            except OSError as exc:  # a link (ELOOP), a file, someone else's entry
                refused.append(f"{parent}/{name}: {exc.strerror or exc}")
    return refused


class Keeper:
    """Keeps every login user's directories there: :meth:`tick` re-reads the accounts only
    when ``/etc/passwd`` changed, or every ``RETRY_SECONDS`` while something was refused (an
    admin may have removed the entry in the way); each refusal is logged once."""

    RETRY_SECONDS = 60.0

    def __init__(self, efs: Path, passwd: Path = PASSWD, login_defs: Path = LOGIN_DEFS):
        self.efs, self.passwd, self.login_defs = efs, passwd, login_defs
        self.stamp: tuple[int, int] | None = None
        self.done_at = float("-inf")
        self.users: dict[str, tuple[int, int]] = {}
        self.refused: set[str] = set()

    def tick(self, now: float | None = None) -> bool:
        """One pass; True when it (re)made the directories."""
        now = time.monotonic() if now is None else now
        try:
            st = os.stat(self.passwd)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_ino)
        except OSError:
            stamp = None
        if stamp is not None and stamp == self.stamp and not (
                self.refused and now - self.done_at >= self.RETRY_SECONDS):
            return False
        users = login_users(self.login_defs)
        users.setdefault(own_user(), (os.geteuid(), os.getegid()))
        refused = set(ensure(self.efs, users))
        for line in sorted(refused - self.refused):
            LOG.error("refusing to make a user's directory: %s", line)
        self.users, self.refused, self.stamp, self.done_at = users, refused, stamp, now
        return True


def user_dirs(parent: Path) -> Iterator[tuple[str, Path]]:
    """``(user, directory)`` of every entry of ``parent`` that is a user's directory: a
    directory (not a link) named after a user and owned by that user. Anything else (the
    old flat layout's job directories, a stray file) is not listed."""
    try:
        entries = sorted(os.scandir(parent), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for e in entries:
        if not USER_NAME_RE.fullmatch(e.name):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            uid = pwd.getpwnam(e.name).pw_uid
        except (OSError, KeyError):
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            yield e.name, Path(e.path)


#: How long ``dl-run`` waits for its directory (a new account's: the executors make it
#: within about a second of /etc/passwd changing, at their next heartbeat).
OWN_DIR_WAIT_SECONDS = 5.0


def own_dir(parent: Path, wait: float = OWN_DIR_WAIT_SECONDS) -> Path:
    """``parent/<caller>/``, the caller's own directory, to create a job in. Made here only
    where the caller owns ``parent`` itself (a one-user setup without a root executor);
    otherwise it must be there (waited for up to ``wait`` seconds), made by root and the
    caller's (UserDirError says why not)."""
    path = parent / own_user()
    deadline = time.monotonic() + wait
    while True:
        try:
            st = os.lstat(path)
            break
        except FileNotFoundError:
            pass
        try:
            if not os.path.lexists(parent) or os.lstat(parent).st_uid == os.geteuid():
                parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                path.mkdir(mode=0o755)
                return path
        except PermissionError:
            pass
        if time.monotonic() >= deadline:
            raise UserDirError(
                f"{path} does not exist: the job executors (root) make a directory there for "
                f"every login user (uid in login.defs' UID_MIN..UID_MAX) when /etc/passwd "
                f"changes; wait a few seconds after the account is created, or ask an admin "
                f"(a system account gets none)")
        time.sleep(0.2)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise UserDirError(f"{path} is not your directory (owner uid {st.st_uid}, mode "
                           f"{stat.filemode(st.st_mode)}): refusing to create a job in it; "
                           "ask an admin to remove it")
    return path

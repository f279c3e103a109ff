"""One instance of a node daemon per node: an exclusive ``flock`` held for the process's life.

Two node agents on one node would both publish generations and both drain; two job
executors would both start the same job share. systemd runs one process per unit, but
nothing stops someone starting the same daemon by hand beside it. So each daemon takes an
exclusive, non-blocking ``flock`` on its lock file in the node's state directory
(``var/lib/dl-agent/<name>.lock``, :meth:`bootstrap_scripts.protocol.paths.NodePaths.lock`)
before it does anything else, and keeps the descriptor open until it exits:

- the kernel drops the lock when the process ends however it ends (SIGKILL, OOM), so there
  is no stale lock to clean up, unlike a pid file;
- the holder writes its pid into the file, so a second instance can say who holds it;
- the descriptor is not inherited by children (``O_CLOEXEC``): a job or data-preparation
  command that outlives the daemon does not keep the node locked.

The lock file is opened with ``O_NOFOLLOW`` and must belong to this user: daemons run as
root, and the state directory must not let anyone plant a link to another file there.

Standard library only; used by the node agent, the job executor and the job controller.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import sys
from pathlib import Path


class AlreadyRunning(RuntimeError):
    """Another process holds the lock; ``pid`` is what it wrote there (0: unknown)."""

    def __init__(self, path: Path, pid: int) -> None:
        self.path = path
        self.pid = pid
        holder = f"pid {pid}" if pid else "a process whose pid is not recorded"
        super().__init__(f"another instance already runs on this node ({holder} holds "
                         f"{path})")


class UnsafeLockFile(RuntimeError):
    """The lock path is not a regular file of this user (a link, someone else's file)."""


class InstanceLock:
    """A held lock; :meth:`release` ends it early (tests, an agent run in a thread)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> InstanceLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def _holder_pid(fd: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode("ascii", "replace").strip()
        return max(0, int(text))
    return 0


def acquire(path: str | os.PathLike) -> InstanceLock:
    """Take the lock at ``path`` (creating it and its directory), or raise
    :class:`AlreadyRunning` naming the holder's pid at once (never waits)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise UnsafeLockFile(f"{path} is not a regular file owned by uid {os.geteuid()}: "
                                 f"refusing to use it as a lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(path, _holder_pid(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return InstanceLock(path, fd)


def hold_or_exit(path: str | os.PathLike, *, program: str, exit_code: int) -> InstanceLock:
    """:func:`acquire`, or print why not on stderr and exit with ``exit_code`` (a status
    the daemon's systemd unit lists in ``RestartPreventExitStatus``: restarting cannot help
    while the other instance runs)."""
    try:
        return acquire(path)
    except (AlreadyRunning, UnsafeLockFile) as exc:
        print(f"{program}: {exc}; exiting with status {exit_code}", file=sys.stderr)
        raise SystemExit(exit_code) from None

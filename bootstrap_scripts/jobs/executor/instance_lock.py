"""One job executor per node: an exclusive ``flock`` held for the executor's whole life.

Two executors on one node would both start every share of every job (and both stop them).
systemd runs one process per unit, but nothing stops a second one started by hand. The
executor takes a non-blocking exclusive ``flock`` on ``var/lib/dl-executor/executor.lock``
(``NodePaths.executor_lock``) before anything else and keeps it until it exits: the kernel
drops the lock however the process ends (kill -9, OOM), so there is never a stale lock; the
holder writes its pid into the file so a second executor can name it; the descriptor is
close-on-exec, so a share that outlives its executor never keeps the node locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path


class AlreadyRunning(RuntimeError):
    """Another executor holds the lock (``pid``: what it wrote there, 0 if unknown)."""

    def __init__(self, path: Path, pid: int) -> None:
        self.path, self.pid = path, pid
        holder = f"pid {pid}" if pid else "a process whose pid is not recorded"
        super().__init__(f"another dl-executor already runs on this node ({holder} holds "
                         f"{path})")


def _holder(fd: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        return max(0, int(os.pread(fd, 32, 0).decode("ascii", "replace").strip() or 0))
    return 0


def acquire(path: Path) -> int:
    """The locked descriptor (keep it open), or :class:`AlreadyRunning`. The file is opened
    with O_NOFOLLOW and must be a regular file of ours: the executor is root."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"{path} is not a regular file owned by uid {os.geteuid()}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(path, _holder(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd
    except BaseException:
        os.close(fd)
        raise

"""At most one process of a program per node: an exclusive ``flock`` held while it lives.

Two job controllers on one master would both run the queue's first job and both restart it.
systemd starts one per unit, but nothing stops a second one started by hand (or by a test).
A heartbeat on EFS cannot settle it: two processes may both read "nobody" before either
writes. An exclusive, non-blocking ``flock`` on a file in the node's state directory can:

- the kernel releases it when the process ends, however it ends (``kill -9``, OOM): no
  stale lock to clean up and nothing for a restarted controller to wait for;
- the holder writes its pid into the file, so the second one says who holds it;
- the descriptor is close-on-exec: an attempt runner the controller started (which may
  outlive it, on purpose) does not keep the lock.

The file is opened with ``O_NOFOLLOW`` and must belong to this user (the controller runs as
root: a link planted in the state directory must not make it lock, or truncate, another
file).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path


class AlreadyRunning(RuntimeError):
    """Another process holds the lock; the message names the file and the holder's pid."""

    def __init__(self, path: Path, pid: int) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"already running on this node: {who} holds {path}")
        self.path, self.pid = path, pid


class Lock:
    """An acquired lock; :meth:`release` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def _holder(fd: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or 0)
    return 0


def acquire(path: Path) -> Lock:
    """Take the lock at ``path`` (its directory created if needed) or raise
    :class:`AlreadyRunning`; OSError when the file is not a plain file of ours."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"{path} is not a plain file owned by uid {os.geteuid()}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(path, _holder(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return Lock(path, fd)

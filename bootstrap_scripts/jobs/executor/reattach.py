"""A restarted executor takes back the shares its predecessor left running.

When the executor dies (``kill -9``, a crash, the OOM killer) systemd starts it again
seconds later, and the node's shares are still running: nothing is wrong with the job.
The new executor therefore supervises them again instead of stopping them: it knows each
process's PID and the share's process group from ``nodes/<rank>.started``, and learns how
each ended from the status file its wrapper (``share_wrapper.py``, the process's parent)
writes under the node's ``var/lib/dl-executor/shares/``.

Only when that status cannot be known (the wrapper itself was killed, or the share was
started without one) is the exit recorded with ``fault="infrastructure"``: the node's
machinery lost the share, which says nothing about the job's code.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from bootstrap_scripts.node import procgroup

#: The returncode recorded when a process's exit status is lost (with ``fault`` set).
LOST_RETURNCODE = 1


def read_status(path: Path) -> int | None:
    """The returncode a wrapper recorded, None when there is none (yet)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd) as fh:
            value = json.load(fh).get("returncode")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def carries_token(pid: int, token: str) -> bool:
    """``pid`` is alive and still one of the share's processes (not a reused PID)."""
    if not procgroup.alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = b"\0" + fh.read() + b"\0"
    except OSError:
        return False
    return b"\0DL_SHARE_TOKEN=" + token.encode() + b"\0" in data


class AdoptedProcess:
    """A share process started by an earlier executor: the part of ``subprocess.Popen``
    the executor uses (``poll``, ``wait``, ``kill``, ``returncode``, ``pid``), answered
    from ``/proc`` and the wrapper's status file since this process is not our child."""

    def __init__(self, pid: int, token: str, status: Path) -> None:
        self.pid = pid
        self.token = token
        self.status = status
        self.returncode: int | None = None
        #: the process ended and nobody recorded how (no wrapper status)
        self.lost = False

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        code = read_status(self.status)
        if code is None and not carries_token(self.pid, self.token):
            code = read_status(self.status)  # it may have written just before exiting
            if code is None:
                self.lost, code = True, LOST_RETURNCODE
        self.returncode = code
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if carries_token(self.pid, self.token):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)


def live_group(pgid: int, token: str) -> int:
    """``pgid`` if one of the share's processes still leads or belongs to it, else 0 (the
    number may belong to someone else by now)."""
    if pgid and any(procgroup.getpgid(p) == pgid for p in procgroup.pids_with_token(token)):
        return pgid
    return 0

"""What a share's process runs as: the job owner's uid, under the exit-status wrapper.

Kept apart from the supervision (``shares``): these are the decisions made once, before a
process starts.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.engine.root_env import root_env
from bootstrap_scripts.protocol.paths import JobPaths

#: Every share process runs under this wrapper, which records its exit status on the node
#: so that a restarted executor can still collect it, and applies the job's argv,
#: environment and working directory only once it runs as the job's user (its docstring).
WRAPPER = Path(__file__).with_name("share_wrapper.py")
#: How long a start waits for the wrapper's word that the command could not be executed
#: (end-of-file, the usual answer, comes as soon as the ``execve`` succeeded); a command on
#: a file system that hangs its ``execve`` does not hang the executor with it.
EXEC_REPORT_SECONDS = 10.0


@dataclass(frozen=True)
class Launch:
    """One share process as the wrapper receives it (never on a command line: the job's
    argv and environment are the user's, and may hold secrets)."""

    status: Path
    uid: int
    gid: int
    cwd: str
    fallback: str
    argv: tuple[str, ...]
    env: dict[str, str]

    def to_bytes(self) -> bytes:
        return json.dumps({"status": str(self.status), "uid": self.uid, "gid": self.gid,
                           "cwd": self.cwd, "fallback": self.fallback,
                           "argv": list(self.argv), "env": self.env}).encode()


def launch_fd(launch: Launch) -> int:
    """An anonymous in-memory file holding ``launch`` (close-on-exec here; passed to the
    wrapper alone): no name on any disk, readable only through this descriptor."""
    fd = os.memfd_create("dl-share-launch", os.MFD_CLOEXEC)
    try:
        data = memoryview(launch.to_bytes())
        while data:
            data = data[os.write(fd, data):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def exec_errors(reports: list[int], timeout: float = EXEC_REPORT_SECONDS) -> list[str]:
    """What each wrapper's child reported on its descriptor in ``reports`` before its
    ``execve`` closed it ("" when the command started, or when nothing came within
    ``timeout`` for all of them together), else why it did not. Every descriptor is closed.
    Read after every process of a share was started, so that their start-ups overlap."""
    deadline = time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {fd: [] for fd in reports}
    waiting = set(reports)
    try:
        while waiting and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(sorted(waiting), [], [], left)
            for fd in ready:
                chunk = os.read(fd, 4096)
                if chunk and sum(map(len, chunks[fd])) < 4096:
                    chunks[fd].append(chunk)
                elif not chunk:
                    waiting.discard(fd)
    finally:
        for fd in reports:
            os.close(fd)
    return [b"".join(chunks[fd]).decode(errors="replace")[:1000] for fd in reports]


def start_wrapped(launch: Launch, token: str, log: BinaryIO, pgid: int,
                  pass_fds: tuple[int, ...] = ()) -> tuple[subprocess.Popen, int]:
    """Start ``launch`` under the wrapper: root's allowlisted environment (``root_env``)
    with the share's token, nothing of the job in its argv, in process group ``pgid`` (0:
    a new one). (the wrapper, the descriptor :func:`exec_errors` reads and closes)."""
    data = launch_fd(launch)
    report_r, report_w = os.pipe()
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", str(WRAPPER), str(data), str(report_w)], cwd="/",
            env=root_env(DL_SHARE_TOKEN=token), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
            # One new group for the whole share, in the executor's session: a later
            # process can join a group only within its own session (setpgid), so the
            # first must not start a session of its own.
            process_group=pgid, pass_fds=(data, report_w, *pass_fds)), report_r
    except BaseException:
        os.close(report_r)
        raise
    finally:
        os.close(data)
        os.close(report_w)


def job_owner(paths: JobPaths) -> tuple[int, int]:
    """Jobs run as the user who published them, not as the executor's root: a user must
    not gain root on every node by submitting a job. The user is the owner of the job's
    directory, and spec.json must be theirs too, both taken from ``fstat`` of what was
    opened without following links (:func:`userfiles.read_owned`): a spec that is a link
    to someone else's file is refused (UnsafeUserFile), never run as that someone.
    (uid, gid) to switch to, (-1, -1) to stay who we are."""
    owned = userfiles.read_owned(paths.dir, paths.spec.name)
    if os.geteuid() != 0 or owned.uid == 0:
        return -1, -1
    return owned.uid, owned.gid


def job_writer(paths: JobPaths) -> tuple[int, int]:
    """Whose rights the executor's writes into the job's directory use: its owner's, taken
    from ``fstat`` of the directory opened without following a link ((-1, -1): ours, for
    root's own jobs or an executor that is not root). For a share already running (a
    re-attach), whatever became of its spec since."""
    uid, gid = userfiles.owner_of_dir(paths.dir)
    if os.geteuid() != 0 or uid == 0:
        return -1, -1
    return uid, gid

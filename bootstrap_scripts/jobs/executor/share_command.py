"""What a share's process runs as: the job owner's uid, under the exit-status wrapper.

Kept apart from the supervision (``shares``): these are the decisions made once, before a
process starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.protocol.paths import JobPaths

#: Every share process runs under this wrapper, which records its exit status on the node
#: so that a restarted executor can still collect it (why: its docstring).
WRAPPER = Path(__file__).with_name("share_wrapper.py")


def wrapped(argv: tuple[str, ...], status: Path, uid: int, gid: int, cwd: str) -> list[str]:
    """``argv`` under the wrapper, which writes its exit status to ``status`` (root) and
    runs ``argv`` as ``uid``/``gid`` (-1: unchanged) in ``cwd``, entered as that user."""
    return [sys.executable, "-I", str(WRAPPER), str(status), str(uid), str(gid), cwd, "--",
            *argv]


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


def usable_cwd(cwd: str, fallback: str) -> str:
    """The spec's working directory if it is a directory (looked at with the rights of the
    caller: under :func:`userfiles.as_user`, the job's user), else ``fallback``."""
    return cwd if cwd and os.path.isdir(cwd) else fallback

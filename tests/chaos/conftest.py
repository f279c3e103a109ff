"""The one emulated cluster the engine drills share (``make chaos``).

Two executor nodes (``tests.support.cluster``: the real installer, the real
``dl-executor`` process per node) and the master's real ``dl-controller`` process, their EFS
a small tmpfs mounted for the session so that "EFS full" is a real ENOSPC from the kernel
to every process at once (root only; without it the EFS-full drill fails saying why).
Everything started here is stopped by PID / process group at the end, and the session
fails if any process is left.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The size of the emulated EFS (a tmpfs): room for the drills' jobs, small enough to fill.
EFS_SIZE = "64m"


def _mount_tmpfs(path: Path) -> str:
    """Mount a tmpfs of :data:`EFS_SIZE` on ``path``; '' when done, else why not."""
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={EFS_SIZE},mode=0755",
                              "chaos-efs", str(path)], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if res.returncode == 0 else (res.stderr.strip() or f"mount: {res.returncode}")


@pytest.fixture(scope="session")
def chaos_cluster(tmp_path_factory) -> Iterator:
    """The shared cluster (a ``LocalCluster``), its executors and controller running;
    ``.efs_mount_error`` says why EFS is a plain directory if it could not be a tmpfs."""
    from tests.support.cluster import start_local_cluster

    tmp = tmp_path_factory.mktemp("chaos")
    efs = tmp / "cluster" / "efs"
    efs.mkdir(parents=True)
    why = _mount_tmpfs(efs)
    c = None
    try:
        c = start_local_cluster(tmp / "cluster", 2)
        c.efs_mount_error = why
        c.start_executors()
        c.start_controller()
        yield c
    finally:
        leftovers: set[int] = set()
        if c is not None:
            c.stop()
            leftovers = c.leftovers()
        if not why:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(["umount", "-l", str(efs)], timeout=30, check=False)
        assert not leftovers, f"processes left behind: {sorted(leftovers)}"

"""The test suite's own machine-wide bookkeeping (``tests/support/users.py``): ``make test``
runs two pytest-xdist workers at once, and a directory :func:`reachable` opened for one
worker's cluster user must stay open until the other worker's test is done with it too."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.support import users
from tests.support.users import reachable

HOLD = """
import sys, time
from pathlib import Path
from tests.support.users import reachable
with reachable(sys.argv[1]):
    Path(sys.argv[2]).write_text("held")
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
"""


def wait_held(other: subprocess.Popen, held: Path) -> None:
    deadline = time.monotonic() + 60
    while not held.exists():
        assert other.poll() is None and time.monotonic() < deadline, "holder never held"
        time.sleep(0.05)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_directory_stays_open_until_its_last_holder_in_any_process_lets_go(tmp_path):
    closed = tmp_path / "closed"
    (closed / "inner").mkdir(parents=True)
    os.chmod(closed, 0o700)
    target = closed / "inner" / "python"
    held, done = tmp_path / "held", tmp_path / "done"
    with reachable(target):
        assert mode(closed) == 0o701
        # another worker's test opens the same directory while this one holds it
        other = subprocess.Popen([sys.executable, "-c", HOLD, str(target), str(held),
                                  str(done)], cwd=REPO_ROOT, start_new_session=True)
        wait_held(other, held)
    try:
        assert mode(closed) == 0o701, "closed while the other process still held it"
        done.write_text("")
        assert other.wait(timeout=60) == 0
        assert mode(closed) == 0o700  # the last holder let go: back to its own mode
    finally:
        done.write_text("")
        if other.poll() is None:
            os.killpg(other.pid, 9)
            other.wait()


def test_a_holder_that_died_without_letting_go_is_dropped(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir()
    os.chmod(closed, 0o700)
    target = closed / "python"
    held, never = tmp_path / "held", tmp_path / "never"
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(target), str(held), str(never)],
                             cwd=REPO_ROOT, start_new_session=True)
    try:
        wait_held(other, held)
    finally:
        os.killpg(other.pid, 9)  # killed while holding: its exit never runs
        other.wait()
    assert mode(closed) == 0o701
    with reachable(target):
        assert mode(closed) == 0o701
    assert mode(closed) == 0o700  # the dead holder no longer keeps it open


def test_a_holder_whose_pid_was_reused_is_dropped(tmp_path):
    """A killed holder's pid may be a live process again: the kernel start time the table
    keeps beside the pid tells them apart (here: this live pid with another start time)."""
    closed = tmp_path / "closed"
    closed.mkdir()
    os.chmod(closed, 0o700)
    with users._holders() as held:  # a dead holder whose pid this process now has
        held[str(closed)] = {"mode": 0o700, "holders": [[os.getpid(), 1]]}
        os.chmod(closed, 0o701)
    with reachable(closed / "python"):
        assert mode(closed) == 0o701
    assert mode(closed) == 0o700

"""``emulator.demo.keeper.detach``: the process ``make demo ARGS=--keep`` started returns
the demo's exit code as soon as the child has it, while the child goes on (the background
service) in a process group of its own; without a kept cluster it returns the child's own
exit status; Ctrl-C reaches the child. Two small Python processes, stopped by pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bootstrap_scripts.node.procgroup import alive
from tests.conftest import REPO_ROOT

CHILD = """
import os, sys, time, signal
sys.path.insert(0, {repo!r})
from emulator.demo import keeper
keeper.detach()
if {mode!r} == "interrupt":  # in place before the test can see the pid file
    signal.signal(signal.SIGINT, lambda _s, _f: os._exit(130))
open({pidfile!r}, "w").write(f"{{os.getpid()}} {{os.getpgid(0)}}")
if {mode!r} == "keep":
    os.write(keeper._to_parent, b"7\\n")
    os.close(keeper._to_parent)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(60)
elif {mode!r} == "interrupt":
    time.sleep(60)
sys.exit(5)
"""


def start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    pidfile = tmp_path / f"{mode}.pid"
    script = CHILD.format(repo=REPO_ROOT, pidfile=str(pidfile), mode=mode)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    return proc, pidfile


def child_of(pidfile: Path) -> tuple[int, int]:
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text().strip():
            pid, pgid = map(int, pidfile.read_text().split())
            return pid, pgid
        time.sleep(0.05)
    raise AssertionError("the child never wrote its pid")


def test_the_parent_returns_the_code_and_the_child_goes_on(tmp_path: Path) -> None:
    proc, pidfile = start(tmp_path, "keep")
    child = 0
    try:
        proc.communicate(timeout=30)  # returns: nobody holds the pipe any more
        child, pgid = child_of(pidfile)
        assert proc.returncode == 7
        assert alive(child) and pgid == child and pgid != os.getpgid(0)
    finally:
        if child and alive(child):
            os.kill(child, signal.SIGKILL)
        proc.kill()


def test_without_a_kept_cluster_the_childs_status(tmp_path: Path) -> None:
    proc, _ = start(tmp_path, "exit")
    try:
        assert proc.wait(timeout=30) == 5
    finally:
        proc.kill()


def test_ctrl_c_reaches_the_child(tmp_path: Path) -> None:
    proc, pidfile = start(tmp_path, "interrupt")
    child = 0
    try:
        child, _ = child_of(pidfile)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert not alive(child)
    finally:
        if child and alive(child):
            os.kill(child, signal.SIGKILL)
        proc.kill()

"""Commands that wait for something (``dlc logs -f``, a foreground ``dl-run``) run with a
time bound of their own: in a process group of their own, killed whole when the bound
passes, so a command that never ends fails its one test with a message (what it printed
so far) instead of hanging the whole run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import stop_popen_group
from tests.conftest import REPO_ROOT
from tests.support.demo import demo_env

#: The bound of one ``dlc logs -f`` of the kept cluster's jobs (the longest runs a minute).
FOLLOW_TIMEOUT = 300.0


def run_bounded(argv: Sequence[str], timeout: float, *, what: str = "",
                **popen: object) -> subprocess.CompletedProcess:
    """Run ``argv`` to its end within ``timeout`` seconds (stdout and stderr captured as
    text); past it, the process group is stopped and the test fails naming the command
    and its output so far."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **popen)  # type: ignore[call-overload]
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_popen_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"{what or ' '.join(map(str, argv))} did not end within {timeout:.0f} s "
                    f"(its process group was stopped); stdout:\n{out[-2000:]}\n"
                    f"stderr:\n{err[-2000:]}")
    finally:
        if proc.poll() is None:  # interrupted (^C): leave nothing behind
            stop_popen_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def dlc_follow(state_path: Path | str, job: str, *, timeout: float = FOLLOW_TIMEOUT
               ) -> tuple[int, str, str]:
    """``dlc --emulator STATE logs -f JOB`` in its own process, bounded: (exit status,
    stdout, stderr)."""
    res = run_bounded([sys.executable, "-m", "dlc", "--emulator", str(state_path), "logs",
                       "-f", job], timeout, what=f"dlc logs -f {job}", cwd=REPO_ROOT,
                      env=demo_env())
    return res.returncode, res.stdout, res.stderr

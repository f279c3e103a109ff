"""The job executor's own faults, with real processes: an executor killed while its shares
run, a second executor on one node, a full file system.

Each test starts emulated nodes (``tests.support.cluster``: the real installer and the real
``dl-executor`` process per node) and a real ``dl-run``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from bootstrap_scripts.node import procgroup
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import ShareExit, ShareStarted
from emulator.nodes import base_env
from tests.conftest import REPO_ROOT

#: A share that says it is ready, then finishes by itself with success a few seconds later
#: (long enough for its executor to be killed and started again meanwhile).
FINISHES_OK = ("python3", "-c", "import time; print('ready', flush=True); time.sleep(6); "
               "print('finished', flush=True)")
#: A share that runs until it is stopped.
RUNS_ON = ("python3", "-c", "import time; print('ready', flush=True); time.sleep(600)")


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _ready(c) -> bool:
    return any("ready" in (store.read_text(JobPaths(d).log(0)) or "") for d in c.job_dirs())


def _kill_executor(c, addr: str) -> None:
    c.executors[addr].send_signal(signal.SIGKILL)
    c.executors[addr].wait()


def test_restarted_executor_reattaches_and_records_the_real_exit(emu):
    """kill -9 of the executor: its share runs on, the restarted executor follows it again
    and records the exit the share really had (0), so the job succeeds."""
    c = emu(1)
    c.start_executors()
    addr = c.addresses[0]
    p = c.popen_runner("--launcher", "each", "--", *FINISHES_OK)
    _wait(lambda: _ready(c), 60, "the share never got ready")
    (jdir,) = c.job_dirs()
    paths = JobPaths(jdir)
    token = procgroup.share_token(JobPaths(jdir).key, 0, addr)
    share = [pid for pid in procgroup.pids_with_token(token) if procgroup.alive(pid)]
    _kill_executor(c, addr)
    assert [pid for pid in share if procgroup.alive(pid)] == share  # the share runs on
    c.start_executors([addr])
    _wait(lambda: store.exists(paths.exit(0)), 60, "no exit recorded")
    rec = store.read_record(paths.exit(0), ShareExit)
    assert rec is not None
    assert (rec.returncode, rec.cancelled, rec.fault) == (0, False, ""), rec
    assert "finished" in (store.read_text(paths.log(0)) or "")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    assert "re-attached" in c.executor_log(addr)


def test_a_share_that_ended_while_its_executor_was_down_gets_its_own_exit(emu, tmp_path):
    """The share fails by itself (exit 3) while no executor runs: the restarted executor
    records exactly that, a failure of the job's code, from the wrapper's status file."""
    c = emu(1)
    c.start_executors()
    addr = c.addresses[0]
    go = tmp_path / "go"
    p = c.popen_runner("--launcher", "each", "--", "python3", "-c",
                       f"import os, sys, time; print('ready', flush=True)\n"
                       f"while not os.path.exists({str(go)!r}): time.sleep(0.1)\n"
                       f"sys.exit(3)")
    _wait(lambda: _ready(c), 60, "the share never got ready")
    (jdir,) = c.job_dirs()
    paths = JobPaths(jdir)
    token = procgroup.share_token(JobPaths(jdir).key, 0, addr)
    _kill_executor(c, addr)
    go.touch()
    _wait(lambda: not procgroup.pids_with_token(token), 30, "the share did not end")
    assert not store.exists(paths.exit(0))  # nobody recorded it yet
    c.start_executors([addr])
    _wait(lambda: store.exists(paths.exit(0)), 60, "no exit recorded")
    rec = store.read_record(paths.exit(0), ShareExit)
    assert rec is not None
    assert (rec.returncode, rec.cancelled, rec.fault) == (3, False, ""), rec
    p.communicate(timeout=60)
    assert p.returncode == 1


def test_a_share_whose_exit_status_is_lost_is_an_infrastructure_failure(emu):
    """The executor is down and the share's wrapper (the only one who could know the exit
    status) is killed too: the restarted executor cannot know how the share ended, so it
    records an infrastructure fault, never a failure of the job's code."""
    c = emu(1)
    c.start_executors()
    addr = c.addresses[0]
    p = c.popen_runner("--launcher", "each", "--", *RUNS_ON)
    _wait(lambda: _ready(c), 60, "the share never got ready")
    (jdir,) = c.job_dirs()
    paths = JobPaths(jdir)
    _kill_executor(c, addr)
    started = store.read_record(paths.started(0), ShareStarted)
    assert started is not None
    os.kill(started.pids[0], signal.SIGKILL)  # the wrapper; its child runs on, orphaned
    c.start_executors([addr])
    _wait(lambda: store.exists(paths.exit(0)), 60, "no exit recorded")
    rec = store.read_record(paths.exit(0), ShareExit)
    assert rec is not None and rec.fault == "infrastructure", rec
    assert rec.returncode != 0 and "exit status" in rec.reason
    token = procgroup.share_token(JobPaths(jdir).key, 0, addr)
    _wait(lambda: not procgroup.pids_with_token(token), 10, "the orphaned child survived")
    p.communicate(timeout=60)


def test_a_second_executor_on_a_node_exits_naming_the_first(emu):
    c = emu(1)
    c.start_executors()
    node = c.nodes[0]
    first = c.executors[node.address].pid
    try:
        res = subprocess.run(
            [sys.executable, "-m", "bootstrap_scripts.jobs.executor", "--root", str(node.root),
             "--mount-point", str(c.efs), "--no-mount", "--address", node.address],
            cwd=REPO_ROOT, env=base_env(), capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("a second executor kept running next to the first") from exc
    assert res.returncode != 0
    assert f"pid {first}" in res.stderr, res.stderr
    assert c.executors[node.address].poll() is None  # the first one is untouched

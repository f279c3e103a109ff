"""``ops/stack_dump.py``: which processes are a job's ranks, and py-spy's dump of them (real
processes, real py-spy: CI runs as root, which ptrace needs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap_scripts.ops import hang_stacks, stack_dump
from bootstrap_scripts.protocol.managed_records import RankStack
from bootstrap_scripts.protocol.paths import ClusterPaths, own_user

#: A rank that sleeps in a function of its own, with a forked child that has the same
#: environment (a data loader worker), printing both pids.
RANK = """
import os, sys, time
def hang_here():
    time.sleep(60)
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(os.getpid(), child, flush=True)
hang_here()
"""


def start(env_extra: dict[str, str]) -> tuple[subprocess.Popen, int, int]:
    env = {"PATH": os.environ.get("PATH", ""), **env_extra}
    proc = subprocess.Popen([sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    pid, child = (int(x) for x in proc.stdout.readline().split())
    return proc, pid, child


@pytest.fixture
def ranks():
    procs = []

    def make(**env: str) -> tuple[int, int]:  # a rank with this environment
        proc, pid, child = start(env)
        procs.append(proc)
        return pid, child

    yield make
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


HERE, THERE = "127.20.0.8", "127.20.0.9"


def test_only_the_jobs_own_ranks_on_this_node_are_found_not_their_children(ranks) -> None:
    r3, _child = ranks(DL_SHARE_TOKEN=f"j.1/0/{HERE}", RANK="3")
    r4, _ = ranks(DL_SHARE_TOKEN=f"j.1/0/{HERE}", OMPI_COMM_WORLD_RANK="4")
    ranks(DL_SHARE_TOKEN=f"j.1/1/{THERE}", RANK="5")  # another node's (one machine here)
    ranks(DL_SHARE_TOKEN=f"j.10/0/{HERE}", RANK="6")  # another job's
    ranks(DL_SHARE_TOKEN=f"j.1/0/{HERE}")  # no rank: a launcher, not a rank
    ranks(RANK="7")  # no token: not started by an executor for this job
    assert stack_dump.find_ranks("j.1", HERE, os.getuid()) == {3: r3, 4: r4}
    assert stack_dump.find_ranks("j.1", HERE, os.getuid() + 4321) == {}  # another user's


def test_py_spy_dumps_the_ranks_stack_as_root(ranks) -> None:
    if os.geteuid() != 0:
        pytest.skip("py-spy reads another process's memory: root only (CI runs as root)")
    pid, _child = ranks(DL_SHARE_TOKEN=f"j.1/0/{HERE}", RANK="0")
    time.sleep(0.2)  # in hang_here by now
    found = stack_dump.dump(pid, timeout=20)
    assert found["error"] == "", found
    assert "hang_here (<string>:" in found["stack"]
    assert found["signature"].startswith("<string>:hang_here;<string>:<module>")


def test_the_node_side_writes_each_stack_as_the_user_and_logs_no_stack(ranks, monkeypatch,
                                                                        capsys, tmp_path) -> None:
    pid, _ = ranks(DL_SHARE_TOKEN=f"{own_user()}/j.1/1/{THERE}", RANK="1")  # the job's key
    monkeypatch.setenv("DL_SHARE_TOKEN", f"health-stacks-x/1/{THERE}")  # this dump's own
    assert stack_dump.main(["--efs", str(tmp_path), "--job-id", "j.1", "--uid",
                            str(os.getuid()), "--gid", str(os.getgid()),
                            "--timeout", "20"]) == 0
    out = capsys.readouterr().out
    found = hang_stacks.parse_stacks("noise\n" + out + "DL-STACK {broken\n")
    assert [(x["rank"], x["pid"], x["written"]) for x in found] == [(1, pid, True)]
    assert set(found[0]) == {"rank", "pid", "written", "error"}  # the stack is not logged
    path = ClusterPaths(tmp_path).job("j.1").stack(1)
    rec = RankStack.from_json(path.read_text())
    assert (rec.rank, rec.pid, rec.address) == (1, pid, THERE)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    if os.geteuid() == 0:
        assert "hang_here" in rec.stack
    assert json.loads(out.split(stack_dump.MARKER, 1)[1])["rank"] == 1


@pytest.mark.parametrize("argv", [
    ["--efs", "/efs", "--job-id", "../x", "--uid", "0", "--gid", "0", "--address", HERE],
    ["--efs", "/efs", "--job-id", "j.1", "--uid", "-1", "--gid", "0", "--address", HERE],
    ["--efs", "efs", "--job-id", "j.1", "--uid", "0", "--gid", "0", "--address", HERE],
    ["--efs", "/efs", "--job-id", "j.1", "--uid", "0", "--gid", "0"]])  # no address known
def test_the_node_side_refuses_what_it_cannot_trust(argv, monkeypatch) -> None:
    monkeypatch.delenv("DL_SHARE_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        stack_dump.main(argv)


def test_the_nodes_install_the_py_spy_the_requirements_pin() -> None:
    from constructs_lib.user_data import PY_SPY_REQUIREMENT
    from tests.conftest import REPO_ROOT

    assert PY_SPY_REQUIREMENT in (Path(REPO_ROOT) / "requirements.txt").read_text().split()
    assert Path(stack_dump.py_spy()).name == "py-spy"

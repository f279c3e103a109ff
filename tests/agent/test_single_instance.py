"""One node agent per node: a second one exits at once, naming the first one's pid."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap_scripts.agent import install
from bootstrap_scripts.agent.settings import EXIT_ALREADY_RUNNING, LOCK_NAME
from bootstrap_scripts.node import single_instance
from bootstrap_scripts.protocol.paths import NodePaths
from tests.support.agents import wait_until

REPO = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time; from bootstrap_scripts.node.single_instance import acquire; "
        "acquire(sys.argv[1]); print('held', flush=True); time.sleep(120)")


def _holder(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


def test_a_second_lock_names_the_holder(tmp_path):
    path = tmp_path / "state" / "x.lock"
    first = single_instance.acquire(path)
    with pytest.raises(single_instance.AlreadyRunning) as exc:
        single_instance.acquire(path)
    assert exc.value.pid == os.getpid() and f"pid {os.getpid()}" in str(exc.value)
    first.release()
    single_instance.acquire(path).release()  # free again once released


def test_the_lock_dies_with_its_holder(tmp_path):
    path = tmp_path / "x.lock"
    proc = _holder(path)
    try:
        with pytest.raises(single_instance.AlreadyRunning) as exc:
            single_instance.acquire(path)
        assert exc.value.pid == proc.pid
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    single_instance.acquire(path).release()  # SIGKILL left no stale lock


def test_a_linked_lock_file_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    link = tmp_path / "x.lock"
    link.symlink_to(target)
    with pytest.raises(OSError):
        single_instance.acquire(link)
    assert target.read_text() == "precious\n"


def test_a_second_agent_exits_naming_the_first_and_is_not_restarted(tmp_path):
    root = tmp_path / "node"
    holder = _holder(NodePaths(root).lock(LOCK_NAME))
    argv = [sys.executable, "-m", "bootstrap_scripts.agent.node_agent", "--role", "worker",
            "--cluster-id", "c", "--stack-name", "s", "--region", "us-east-1",
            "--root", str(root), "--no-mount", "--mount-point", str(tmp_path / "efs")]
    second = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        _out, err = second.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        _stop(second)
        raise AssertionError("the second agent kept running beside the first") from None
    finally:
        _stop(holder)
    assert second.returncode == EXIT_ALREADY_RUNNING
    assert f"pid {holder.pid}" in err and "event=already-running" in err
    assert not (tmp_path / "efs" / "cluster" / "nodes").exists()  # it did not register
    unit = install.agent_unit("/usr/bin/python3", "/opt/dl", ["--role=worker"])
    prevented = re.search(r"^RestartPreventExitStatus=(.*)$", unit, flags=re.M).group(1)
    assert str(EXIT_ALREADY_RUNNING) in prevented.split()


def test_an_agent_thread_beside_a_running_one_leaves_it_alone(env, tmp_path):
    from bootstrap_scripts.agent.identity import NodeIdentity
    from emulator.resources import create_cluster
    from tests.conftest import REGION
    from tests.support.agents import AgentThread, config

    endpoint, _recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    me = NodeIdentity("i-w", "p3.2xlarge", "127.20.128.9", REGION)
    first = AgentThread(config(cluster, "worker", tmp_path, "w"), me)
    threads.append(first)
    wait_until(lambda: (tmp_path / "efs" / "cluster" / "nodes" / "i-w.json").exists(), 10,
               what="the first agent to register")
    second = AgentThread(config(cluster, "worker", tmp_path, "w"), me)
    second.thread.join(timeout=30)
    assert second.exit_code == EXIT_ALREADY_RUNNING
    assert first.thread.is_alive()
    first.stop()
    third = AgentThread(config(cluster, "worker", tmp_path, "w"), me)  # the lock is free
    threads.append(third)
    log = tmp_path / "efs" / "cluster" / "logs" / "i-w.log"
    wait_until(lambda: log.read_text().count("event=start ") == 2, 10,
               what="the third agent to start (the second never did)")
    assert third.exit_code is None


def test_hold_or_exit_names_the_holder_and_exits_with_the_given_status(tmp_path, capsys):
    path = tmp_path / "dl-executor.lock"
    with single_instance.acquire(path):
        with pytest.raises(SystemExit) as exc:
            single_instance.hold_or_exit(path, program="dl-executor", exit_code=75)
        assert exc.value.code == 75
    err = capsys.readouterr().err
    assert err.startswith("dl-executor: another instance") and f"pid {os.getpid()}" in err
    single_instance.hold_or_exit(path, program="dl-executor", exit_code=75).release()

"""End-to-end: ``python -m emulator.demo`` as a user runs it, one scenario per test.

Each test runs the demo in a subprocess (its own session), then asserts on
``demo-report.json``, on the files the nodes wrote (kept because ``--work-dir`` is ours),
and that no process the demo started is still alive. A demo that hangs is killed by its
process group, so a failing test never leaves a cluster behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import pids_in_groups
from bootstrap_scripts.protocol import paths as pp
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import JobResult
from emulator.demo.context import STATE_FILE
from tests.conftest import REPO_ROOT
from tests.support.demo import (
    assert_nothing_left,
    check_common,
    demo_env,
    node_files,
    recorded_groups,
    run_demo,
    training_attempts,
)

pytestmark = pytest.mark.slow


def test_demo_with_a_failed_worker_launch_trains_on_every_node_that_came_up(tmp_path):
    """Three workers asked for, one launch fails as AWS fails it: the Lambda lowers the
    group to what launched, the cluster forms with the rest and the job trains on all of
    them (one demo for both: the whole path with a launch failure is the longer one)."""
    code, out, report = run_demo(tmp_path, "--workers", "3", "--fail-launches", "1",
                                 "--epochs", "5", "--require-acc", "0.85")
    assert code == 0, out
    live = check_common(tmp_path, report, 3)
    assert report["world_size"] == 3
    assert report["counts"] == {"workers_requested": 3, "worker_launches_failed": 1,
                                "workers_launched": 2, "workers_running": 2, "workers_killed": 0,
                                "nodes_in_membership": 3}
    assert [e["epoch"] for e in report["epochs"]] == [1, 2, 3, 4, 5]
    assert report["final_acc"] >= 0.85
    (failed,) = report["failed_launches"]
    assert failed not in report["membership"]["nodes"]
    # The Lambda lowered the worker group's desired capacity to what launched.
    assert report["stack"]["groups"]["worker"]["desired"] == 2
    outcomes = [o for n in report["notifications"] for o in n["outcomes"]]
    assert "asg-setup-success" in outcomes
    assert any(n["events"] == ["autoscaling:EC2_INSTANCE_LAUNCH_ERROR"]
               for n in report["notifications"])
    assert "desired capacity lowered" in (tmp_path / "work" / "logs" / "lambda.log").read_text()
    # Every node wrote the same shared files for generation 1, each with its own rank.
    files = [node_files(report, n) for n in live]
    for rel in (pp.WORKERS_FILE, pp.MPI_HOSTFILE, pp.MEMBERSHIP_FILE):
        assert len({f[rel] for f in files}) == 1, rel
    assert sorted(n["env"]["DEEPLEARNING_NODE_RANK"] for n in live) == ["0", "1", "2"]
    assert all("deeplearning-master" in f[pp.HOSTS_FILE] for f in files)
    assert Membership.from_json(files[0][pp.MEMBERSHIP_FILE]).generation == 1
    cluster = ClusterPaths(tmp_path / "work" / "efs")
    # the training job's one attempt (the health gate's check jobs are there too)
    (jdir,) = training_attempts(cluster)
    result = store.read_record(cluster.job(jdir.name, jdir.parent.name).result, JobResult)
    assert result is not None and result.status == "succeeded"
    assert "job" in out and "succeeded on 3 node(s)" in out
    assert_nothing_left(tmp_path, report)


def test_bad_input_fails_fast_with_a_clear_message(tmp_path):
    res = subprocess.run([sys.executable, "-m", "emulator.demo", "--workers", "2",
                          "--fail-launches", "3"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2
    assert "--fail-launches 3 is more than --workers 2" in res.stderr
    res = subprocess.run([sys.executable, "-m", "emulator.demo", "--wrokers", "2"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--wrokers" in res.stderr


def test_port_in_use_stops_with_a_clear_message_and_cleans_up(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        s.listen()
        port = s.getsockname()[1]
        code, out, report = run_demo(tmp_path, "--port", str(port), timeout=120)
    assert code == 1, out
    assert f"port {port} on localhost is already in use" in out
    assert report["status"] == "failed" and "already in use" in report["error"]
    assert not (tmp_path / "work" / STATE_FILE).exists() or not pids_in_groups(
        recorded_groups(tmp_path))


def processes_marked(marker: str) -> set[int]:
    """Every live process whose environment carries ``marker`` (inherited from the demo)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in env:
            found.add(int(entry.name))
    return found


def test_ctrl_c_on_a_demo_piped_into_a_closed_reader_leaves_nothing(tmp_path):
    """``make demo | tee demo.log`` then Ctrl-C: the reader dies with the demo, so the demo's
    next write fails; the teardown must still stop every process it started."""
    marker = f"DL_DEMO_TEST_MARKER={tmp_path}"
    report = tmp_path / "demo-report.json"
    p = subprocess.Popen(
        [sys.executable, "-m", "emulator.demo", "--workers", "1", "--work-dir",
         str(tmp_path / "work"), "--report", str(report)],
        cwd=REPO_ROOT, env={**demo_env(), "DL_DEMO_TEST_MARKER": str(tmp_path)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    try:
        for line in p.stdout:  # until the nodes run: the moment a cluster can be left behind
            seen.append(line)
            if "waiting for all" in line:
                break
        assert any("waiting for all" in s for s in seen), "".join(seen)
        p.stdout.close()  # the reader goes away (tee killed by the same Ctrl-C) ...
        os.kill(p.pid, signal.SIGINT)  # ... and the demo gets its SIGINT
        code = p.wait(timeout=180)
        left = processes_marked(marker)
    finally:
        for pid in processes_marked(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    assert not left, f"processes left behind: {sorted(left)}"
    assert code == 130
    rep = json.loads(report.read_text())
    assert rep["error"] == "interrupted" and rep["leftover_pids"] == []

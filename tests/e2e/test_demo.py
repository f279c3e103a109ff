"""End-to-end: ``python -m emulator.demo`` as a user runs it, one scenario per test.

Each test runs the demo in a subprocess (its own session), then asserts on
``demo-report.json``, on the files the nodes wrote (kept because ``--work-dir`` is ours),
and that no process the demo started is still alive. A demo that hangs is killed by its
process group, so a failing test never leaves a cluster behind.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap_scripts.procgroup import alive, pids_in_groups
from bootstrap_scripts.protocol import paths as pp
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import JobResult
from emulator.demo.context import BIN_DIR, STATE_FILE
from tests.conftest import REPO_ROOT
from tests.support.demo import (
    DEMO_TIMEOUT,
    assert_nothing_left,
    demo_env,
    recorded_groups,
    run_demo,
)

pytestmark = pytest.mark.slow


def node_files(report: dict, node: dict) -> dict[str, str]:
    root = Path(node["root"])
    return {rel: (root / rel).read_text() for rel in
            (pp.WORKERS_FILE, pp.MPI_HOSTFILE, pp.MEMBERSHIP_FILE, pp.ENV_FILE, pp.HOSTS_FILE)}


def check_common(tmp_path: Path, report: dict, n_nodes: int) -> list[dict]:
    """Assertions every successful scenario shares; returns the running nodes."""
    assert report["status"] == "succeeded", report.get("error")
    assert report["stack"]["resources"] > 50
    assert set(report["stack"]["function_env"]) >= {"MASTER_QUEUE_URL", "CLUSTER_ID",
                                                    "CLUSTER_TAG_KEY", "ROLE_TAG_KEY"}
    live = [n for n in report["nodes"] if n["status"] in ("stopped", "running")]
    assert len(live) == n_nodes
    assert [n["role"] for n in live].count("master") == 1
    for n in live:
        assert n["address"].startswith("127.20.")
        assert n["gpus"] == 0  # CPU machine: nvidia-smi absent
        assert n["env"]["DEEPLEARNING_NODE_ADDR"] == n["address"]
        assert n["env"]["DEEPLEARNING_MASTER_ADDR"] == report["membership"]["nodes"][0]
    signals = report["wait_condition"]
    assert [s["Status"] for s in signals] == ["SUCCESS"]
    assert signals[0]["_content_type"] == ""  # presigned-URL rule: empty Content-Type
    for key in ("bootstrap_s", "deploy_s", "boot_to_membership_s", "job_s", "total_s"):
        assert report["timings"][key] > 0
    epochs = report["epochs"]
    assert epochs and all(e["world_size"] == report["world_size"] for e in epochs)
    assert all(e["samples_per_s"] > 0 for e in epochs)
    efs = tmp_path / "work" / "efs"
    assert ClusterPaths(efs).membership.exists()
    assert (efs / "checkpoints" / "digits" / "latest.json").exists()
    return live


def test_demo_with_two_workers(tmp_path):
    code, out, report = run_demo(tmp_path, "--workers", "2", "--epochs", "5",
                                 "--require-acc", "0.85")
    assert code == 0, out
    live = check_common(tmp_path, report, 3)
    assert report["world_size"] == 3
    assert report["counts"] == {"workers_requested": 2, "worker_launches_failed": 0,
                                "workers_launched": 2, "workers_running": 2, "workers_killed": 0,
                                "nodes_in_membership": 3}
    assert [e["epoch"] for e in report["epochs"]] == [1, 2, 3, 4, 5]
    assert report["final_acc"] >= 0.85
    # Every node wrote the same shared files for generation 1, each with its own rank.
    files = [node_files(report, n) for n in live]
    for rel in (pp.WORKERS_FILE, pp.MPI_HOSTFILE, pp.MEMBERSHIP_FILE):
        assert len({f[rel] for f in files}) == 1, rel
    assert sorted(n["env"]["DEEPLEARNING_NODE_RANK"] for n in live) == ["0", "1", "2"]
    assert all("deeplearning-master" in f[pp.HOSTS_FILE] for f in files)
    assert Membership.from_json(files[0][pp.MEMBERSHIP_FILE]).generation == 1
    cluster = ClusterPaths(tmp_path / "work" / "efs")
    (jdir,) = cluster.jobs_dir.iterdir()
    result = store.read_record(cluster.job(jdir.name).result, JobResult)
    assert result is not None and result.status == "succeeded"
    assert "job" in out and "succeeded on 3 node(s)" in out
    assert_nothing_left(tmp_path, report)


def test_demo_with_a_failed_worker_launch(tmp_path):
    code, out, report = run_demo(tmp_path, "--workers", "3", "--fail-launches", "1",
                                 "--epochs", "4", "--require-acc", "0.8")
    assert code == 0, out
    check_common(tmp_path, report, 3)
    assert report["counts"]["workers_requested"] == 3
    assert report["counts"]["worker_launches_failed"] == 1
    assert report["counts"]["workers_running"] == 2
    assert report["world_size"] == 3
    (failed,) = report["failed_launches"]
    assert failed not in report["membership"]["nodes"]
    # The Lambda lowered the worker group's desired capacity to what launched.
    assert report["stack"]["groups"]["worker"]["desired"] == 2
    outcomes = [o for n in report["notifications"] for o in n["outcomes"]]
    assert "asg-setup-success" in outcomes
    assert any(n["events"] == ["autoscaling:EC2_INSTANCE_LAUNCH_ERROR"]
               for n in report["notifications"])
    assert "desired capacity lowered" in (tmp_path / "work" / "logs" / "lambda.log").read_text()
    assert_nothing_left(tmp_path, report)


def test_demo_kill_a_worker_mid_training_then_resume(tmp_path):
    code, out, report = run_demo(tmp_path, "--workers", "2", "--kill-node-after", "0",
                                 "--epochs", "12", "--require-acc", "0.85")
    assert code == 0, out
    kill = report["kill"]
    assert kill and kill["address"]
    first, resumed = report["jobs"]
    assert first["exit_code"] != 0 and first["killed"]["address"] == kill["address"]
    assert kill["job_error_names_node"], first["failure"]
    assert resumed["resumed"] and resumed["exit_code"] == 0
    assert resumed["world_size"] == 2
    assert resumed["epochs"][0]["epoch"] > 1  # continued from a checkpoint
    assert resumed["epochs"][-1]["epoch"] == 12
    assert first["epochs"][-1]["epoch"] < 12  # the kill interrupted training
    assert report["final_acc"] >= 0.85
    assert kill["new_generation"] == 2
    assert kill["address"] not in report["membership"]["nodes"]
    assert len(report["membership"]["nodes"]) == 2
    killed = [n for n in report["nodes"] if n["status"] == "killed"]
    assert [n["address"] for n in killed] == [kill["address"]]
    efs = tmp_path / "work" / "efs"
    log = ClusterPaths(efs).membership_log.read_text()
    assert f"REMOVED {kill['address']}" in log
    assert ClusterPaths(efs).generation(2).exists()
    # the summary says which job each figure is from (world size 3, then 2 after the kill)
    assert re.search(r"job 1 \(first, a node killed at [\d.]+\): world size\s*│\s*3", out)
    assert re.search(r"job 2 \(resumed\): world size\s*│\s*2", out)
    assert re.search(r"job 2 \(resumed\): final accuracy", out)
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


def test_demo_keep_leaves_a_usable_cluster_and_stop_removes_it(tmp_path: Path) -> None:
    """--keep: the cluster stays up and answers dl-health; --stop: every process and the
    temp dir it made are gone."""
    report_path = tmp_path / "keep-report.json"
    env = demo_env()
    proc = subprocess.run(
        [sys.executable, "-m", "emulator.demo", "--keep", "--epochs", "2", "--require-acc", "0.3",
         "--report", str(report_path)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=DEMO_TIMEOUT)
    report = json.loads(report_path.read_text())
    work = Path(report["work_dir"])
    state_file = work / STATE_FILE
    try:
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert report["kept"] is True and state_file.exists()
        assert f"--stop {state_file}" in proc.stdout
        state = json.loads(state_file.read_text())
        groups = {n["group"]["pid"] for n in state["nodes"]} | {state["cloud"]["pid"]}
        assert all(alive(g) for g in groups), "kept cluster is not running"
        master = next(n for n in state["nodes"] if n["role"] == "master")
        health = subprocess.run(
            [str(Path(master["root"]) / BIN_DIR / "dl-health"), "--root", master["root"]],
            capture_output=True, text=True, timeout=120)
        assert health.returncode == 0, health.stdout + health.stderr
        assert "healthy" in health.stdout
    finally:
        stop = subprocess.run([sys.executable, "-m", "emulator.demo", "--stop", str(state_file)],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    left = pids_in_groups(groups) | {g for g in groups if alive(g)}
    assert not left, f"processes left behind after --stop: {sorted(left)}"
    assert not work.exists(), "--stop did not remove the demo's temp dir"

"""A new user's first hour: every failure says what happened and what to do next.

One demo run here plays every worker launch failing. A failed job's message, the cluster
``--keep`` keeps after it, the master shell it writes and ``--stop`` are checked on the kept
cluster of tests/cli/test_e2e.py (its demo job fails its accuracy target: one boot for
both). The rest check the messages without a cluster (argument errors, the summary's labels,
the Makefile, README).
Each test asserts the sentence that names the cause, not the whole text.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from bootstrap_scripts.jobs.engine.summary import last_error_line
from bootstrap_scripts.protocol.paths import JobPaths
from emulator.demo import report as demo_report
from emulator.demo.context import STATE_FILE
from lambda_src.group_state import GroupSnapshot, decide_launch
from tests.conftest import REPO_ROOT
from tests.support.demo import DEMO_TIMEOUT, demo_env


def demo(tmp: Path, *args: str, timeout: float = DEMO_TIMEOUT) -> tuple[int, str, dict]:
    """Run the demo as ``make demo`` would, with its temp work dir under ``tmp`` (TMPDIR), so
    a hung run can still be stopped from the state file it wrote."""
    env = {**demo_env(), "TMPDIR": str(tmp)}
    report = tmp / "report.json"
    p = subprocess.Popen([sys.executable, "-m", "emulator.demo", "--report", str(report),
                          *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_all(tmp)
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"demo timed out; output:\n{out}") from None
    return p.returncode, out, json.loads(report.read_text()) if report.exists() else {}


def state_groups(state_file: Path) -> set[int]:
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(state_file.read_text())
        groups = {n["group"]["pid"] for n in state["nodes"] if n.get("group")}
        groups |= {r["pid"] for r in state.get("runners", [])}
        if state.get("cloud"):
            groups.add(state["cloud"]["pid"])
        if state.get("service"):  # --keep's background service (emulator.demo.keeper)
            groups.add(state["service"]["pid"])
        return groups
    return set()


def stop_all(tmp: Path) -> None:
    """Last resort: SIGKILL every process group any demo under ``tmp`` recorded."""
    for state_file in tmp.glob(f"dl-demo-*/{STATE_FILE}"):
        for pgid in state_groups(state_file):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


# -- 16.8: every worker launch fails ----------------------------------------------------------


@pytest.mark.slow
def test_every_worker_launch_failing_says_so_once(tmp_path):
    code, out, report = demo(tmp_path, "--workers", "1", "--fail-launches", "1", timeout=300)
    try:
        assert code == 1, out[-3000:]
        assert "sufficient the requested" not in out  # the instance type is named
        assert "EC2_INSTANCE_LAUNCH_ERROR" in out and "-> asg-setup-failure" in out
        assert "ok worker group now" not in out
        assert "worker group below its minimum (1): 0 of 1 launched" in out
        last = "\n".join(out.strip().splitlines()[-4:])
        cause = re.search(r"demo failed: (.*)", last)
        assert cause, last
        group = report["stack"]["groups"]["worker"]["name"]
        assert "--fail-launches 1 left fewer workers than the worker group's minimum" in \
            cause.group(1)
        assert f"worker group {group}: cannot reach its minimum" in cause.group(1)
        assert cause.group(1).count(group) == 1
        assert Path(report["work_dir"]).is_dir(), "a failed run must keep its work dir"
    finally:
        stop_all(tmp_path)


def test_launch_failure_reason_does_not_repeat_the_group():
    snap = GroupSnapshot("grp-w", "worker", min_size=1, max_size=2, desired=2, instances=())
    decision = decide_launch(snap, launch_error=True, error_text="no capacity")
    assert decision.status == "failure"
    assert decision.reason.startswith("cannot reach its minimum: only 0 of 2")
    assert "grp-w" not in decision.reason and "no capacity" in decision.reason


# -- messages checked without a cluster -------------------------------------------------------


def test_the_failing_nodes_own_error_line_is_found(tmp_path):
    """torchrun ends a failed share with a report that only repeats the exit code; the
    runner's summary quotes the program's own last error line instead."""
    job = JobPaths(tmp_path / "job")
    job.nodes.mkdir(parents=True)
    job.log(0).write_text(
        "epoch=3 acc=0.92\nerror: final held-out accuracy 0.9222 is below --require-acc 0.95\n"
        "E1122 14:53:20 api.py:1002] failed (exitcode: 1) local_rank: 0\n"
        "Traceback (most recent call last):\n  File \"run.py\", line 1\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "  error_file: <N/A>\n")
    assert last_error_line(job, 0) == ("error: final held-out accuracy 0.9222 is below "
                                       "--require-acc 0.95")
    job.log(1).write_text("ValueError: batch 63 is not a multiple of world size 2\n")
    assert last_error_line(job, 1).startswith("ValueError: batch 63")
    assert last_error_line(job, 2) == ""


def test_bad_input_speaks_in_make_demo_terms():
    res = subprocess.run([sys.executable, "-m", "emulator.demo", "--workers", "0"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.startswith('usage: make demo ARGS="')
    assert "make demo: error: --workers must be at least 1, got 0" in res.stderr
    assert "python -m emulator.demo" not in res.stderr


def test_make_demo_installs_only_the_debian_package_the_nodes_need():
    """iptables (every node's IMDS guard), not the MPI tests' sshd and Open MPI."""
    res = subprocess.run(["make", "-n", "demo"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "emulator.demo" in res.stdout
    assert "scripts/system-deps.sh iptables" in res.stdout
    assert "system-deps.sh\n" not in res.stdout  # the full list is make test's


def test_readme_states_first_run_size_and_time():
    readme = (Path(REPO_ROOT) / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"first `make demo` installs about [\d.]+ GB", quick), quick
    assert re.search(r"takes about [\d.]+ minutes", quick), quick


def test_summary_labels_the_figures_of_each_job():
    """After a kill and --resume, each figure says which job it is from."""
    def job(resumed: bool, world: int, epochs: range, acc, code: int, killed=None) -> dict:
        return {"job_id": "j", "exit_code": code, "resumed": resumed, "world_size": world,
                "final_acc": acc, "seconds": 1.0, "failure": "", "killed": killed,
                "epochs": [{"epoch": e, "acc": 0.9, "loss": 0.1, "samples_per_s": 1000 * world,
                            "world_size": world} for e in epochs]}
    rep = {"nodes": [], "timings": {}, "counts": {"workers_requested": 2,
                                                  "workers_launched": 2, "workers_running": 1},
           "jobs": [job(False, 3, range(1, 5), None, 1, {"address": "127.20.128.7"}),
                    job(True, 2, range(5, 13), 0.97, 0)]}
    console = Console(record=True, width=200)
    demo_report.summary_table(console, rep)
    text = console.export_text()
    assert re.search(r"job 1 \(first, a node killed at 127\.20\.128\.7\): world size\s*│\s*3\b",
                     text)
    assert re.search(r"job 1 \(first[^)]*\): samples/s \(median\)\s*│\s*3000\b", text)
    assert re.search(r"job 2 \(resumed\): world size\s*│\s*2\b", text)
    assert re.search(r"job 2 \(resumed\): final accuracy\s*│\s*0\.970\b", text)
    assert not re.search(r"│ (world size|final accuracy|samples/s)", text), "unlabelled"

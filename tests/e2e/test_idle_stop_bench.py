"""``make bench``: idle stop end to end on a kept emulated cluster (real processes: moto, the
CDK deploy, the agents, the executors, the job controller, torchrun), and its figure.

The cluster is deployed with ``idleStopMinutes=1`` (the smallest stack setting: the
controller's clock is real). After the demo's job the cluster is idle; a minute later the
job controller scales the worker group to zero, each worker drained by the termination
hook like any scale-in, the master staying. ``dlc submit`` then says the workers were
stopped, the controller scales them back to their size before the stop, and the job waits
for them and runs on every node. Everything goes through ``dlc`` (AWS APIs and Run Command).
Printed: minutes from the last job's end to zero workers, and seconds from ``dlc submit`` to
the job running on the full cluster again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import alive, pids_in_groups
from dlc.cli import main
from emulator.demo.context import STATE_FILE
from emulator.nodes import PYTHON
from tests.conftest import REPO_ROOT
from tests.support.bounded import dlc_follow
from tests.support.demo import DEMO_TIMEOUT, demo_env
from tests.support.users import CAN_CREATE_USERS, cluster_user, reachable

pytestmark = pytest.mark.bench
#: idleStopMinutes of the drill's cluster; and how long each phase may take at most.
IDLE_MINUTES = 1
PHASE_TIMEOUT = 420.0


def dlc(state_path: Path, capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--emulator", str(state_path), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def status(state_path: Path, capsys) -> dict:
    code, out, err = dlc(state_path, capsys, "status", "--json")
    assert code == 0, err
    return json.loads(out)


def workers(st: dict) -> list[dict]:
    return [n for n in st["nodes"] if n["role"] == "worker" and n["instance_id"]]


def wait_for(what: str, check, timeout: float = PHASE_TIMEOUT, every: float = 3.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


@contextlib.contextmanager
def kept_cluster(tmp: Path):
    """A kept demo cluster (1 worker, idleStopMinutes=1), stopped at the end, always, every
    process group it started checked gone."""
    report_path = tmp / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "emulator.demo", "--keep", "--workers", "1", "--context",
         f"idleStopMinutes={IDLE_MINUTES}", "--epochs", "1", "--require-acc", "0",
         "--report", str(report_path)],
        cwd=REPO_ROOT, env=demo_env(), capture_output=True, text=True, timeout=DEMO_TIMEOUT)
    report = json.loads(report_path.read_text())
    state_path = Path(report["work_dir"]) / STATE_FILE
    groups: set[int] = set()
    try:
        state = json.loads(state_path.read_text())
        groups = {n["group"]["pid"] for n in state["nodes"] if n.get("group")}
        groups.add(state["cloud"]["pid"])
        if state.get("service"):
            groups.add(state["service"]["pid"])
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        yield state_path, report
    finally:
        with contextlib.suppress(OSError, ValueError):  # nodes booted since (the resume's)
            later = json.loads(state_path.read_text())
            groups |= {n["group"]["pid"] for n in later["nodes"] if n.get("group")}
        stop = subprocess.run([sys.executable, "-m", "emulator.demo", "--stop", str(state_path)],
                              cwd=REPO_ROOT, env=demo_env(), capture_output=True, text=True,
                              timeout=120)
        left = pids_in_groups(groups) | {g for g in groups if alive(g)}
        for pgid in left:
            os.killpg(pgid, signal.SIGKILL)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert not left, f"processes left behind after --stop: {sorted(left)}"


@pytest.mark.skipif(not CAN_CREATE_USERS, reason="the job's user is created (root only)")
def test_bench_idle_stop_to_zero_workers_and_back_for_the_next_job(tmp_path, capsys):
    with kept_cluster(tmp_path) as (state_path, report):
        work = Path(report["work_dir"])
        st = status(state_path, capsys)
        assert len(workers(st)) == 1, st["nodes"]
        code, out, err = dlc(state_path, capsys, "jobs", "--json")
        assert code == 0, err
        last_end = max((j.get("finished_at") or 0) for j in json.loads(out)) or time.time()

        # 1. idle: the workers stop (the master stays), and dlc status says so
        def stopped() -> dict | None:
            s = status(state_path, capsys)
            idle = s.get("idle_stop") or {}
            return s if idle.get("stopped_at") and not workers(s) else None

        st = wait_for("the idle stop to take the workers to zero", stopped)
        zero_at = time.time()
        assert [n["role"] for n in st["nodes"] if n["instance_id"]] == ["master"]
        assert st["idle_stop"]["desired_before"] == 1
        from rich.console import Console

        from dlc import status as status_mod
        console = Console(record=True, width=200)
        status_mod.render(console, st)
        assert "workers STOPPED at" in console.export_text()
        drains = sorted((work / "efs" / "cluster" / "drain").glob("*.json"))
        assert drains, "the workers left without the drain hook"

        # 2. dlc submit on the stopped cluster: workers back, the job runs on both nodes
        python_dir = os.path.realpath(os.path.dirname(PYTHON))
        with cluster_user() as user, reachable(os.path.realpath(PYTHON), PYTHON,
                                                python_dir + "/x", REPO_ROOT + "/x",
                                                work / "x"):
            submitted = time.monotonic()
            code, out, err = dlc(state_path, capsys, "submit", "--as", user.pw_name, "--json",
                                 "--", "python", "-m", "bootstrap_scripts.examples.train_digits",
                                 "--epochs", "1", "--require-acc", "0")
            assert code == 0, err
            assert "workers STOPPED" in err and "waits for its 2 node(s)" in err, err
            job = json.loads(out)["job_id"]
            code, out, err = dlc_follow(state_path, job, timeout=PHASE_TIMEOUT)
            back = time.monotonic() - submitted
            assert code == 0 and f"job {job} succeeded" in err, out[-2000:] + err
        code, out, err = dlc(state_path, capsys, "jobs", "--json")
        assert code == 0, err
        (record,) = [j for j in json.loads(out) if j["job_id"] == job]
        assert record["world_size"] == 2, record
        st = status(state_path, capsys)
        assert len(workers(st)) == 1 and not st["idle_stop"].get("stopped_at")
    print(f"\n[bench] idle stop: minutes from the last job to zero workers  "
          f"{(zero_at - last_end) / 60:5.2f} min  (idleStopMinutes={IDLE_MINUTES}; polled "
          f"every 3 s)")
    print(f"[bench] idle stop: dlc submit on a stopped cluster -> job done on 2 nodes  "
          f"{back:6.1f} s  (worker launch, boot, join, 1 epoch)")

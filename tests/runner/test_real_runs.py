"""Real jobs on emulated nodes: executors bound to 127.21.x addresses, one EFS directory."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import alive
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths
from bootstrap_scripts.protocol.records import JobResult, RunnerHeartbeat, ShareExit
from emulator.nodes import PYTHON, base_env
from tests.conftest import REPO_ROOT
from tests.support.cluster import free_rdzv_port

pytestmark = pytest.mark.slow
JOBS = Path(__file__).parent / "jobs"
EPOCH_RE = re.compile(
    r"^\[0 (\S+)\] epoch=(\d+) acc=([\d.]+) .*samples_per_s=(\d+) world_size=(\d+)")


def test_example_job_trains_on_two_nodes_and_resumes_with_another_world_size(emu):
    c = emu(2)
    c.start_executors()
    res = c.run("--rdzv-port", free_rdzv_port(c), "--",
                "-m", "bootstrap_scripts.examples.train_digits", "--require-acc", "0.95")
    assert res.returncode == 0, res.stdout
    epochs = [EPOCH_RE.match(line) for line in res.stdout.splitlines()]
    epochs = [e for e in epochs if e]
    assert [int(e.group(2)) for e in epochs] == list(range(1, 21)), res.stdout
    assert {e.group(1) for e in epochs} == {c.membership.master_addr}
    assert {e.group(5) for e in epochs} == {"2"}
    assert float(epochs[-1].group(3)) >= 0.95, res.stdout
    assert f"job {c.job_dirs()[0].name} succeeded on 2 node(s)" in res.stdout

    (jdir,) = c.job_dirs()
    spec = JobSpec.from_json(store.read_text(JobPaths(jdir).spec) or "")
    assert [s.address for s in spec.shares] == c.addresses
    assert "torch.distributed.run" in (jdir / "commands.txt").read_text()
    # torchrun's logs went to the job's directory (one run directory per node's agent),
    # not to a /tmp/torchelastic_* of their own that nobody removes
    runs = sorted(p.name for p in (jdir / "torchelastic").iterdir())
    assert len(runs) == 2 and all(r.startswith(f"{jdir.name}_") for r in runs), runs
    for rank in (0, 1):
        assert store.read_record(JobPaths(jdir).exit(rank), ShareExit).returncode == 0
    assert store.read_record(JobPaths(jdir).result, JobResult).status == "succeeded"
    ckdir = c.efs / "checkpoints" / pwd.getpwuid(os.geteuid()).pw_name / "digits"
    assert json.loads((ckdir / "latest.json").read_text())["epoch"] == 20

    # Resume with world size 1 (the cluster shrank): continues at epoch 21, same accuracy.
    env = {**base_env(), "EFS_MOUNT": str(c.efs)}
    out = subprocess.run([PYTHON, "-m", "bootstrap_scripts.examples.train_digits", "--resume",
                          "--epochs", "22", "--require-acc", "0.95"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "saved with world size 2, now 1" in out.stdout
    assert re.findall(r"^epoch=(\d+)", out.stdout, re.M) == ["21", "22"]


def test_a_failing_rank_fails_the_job_naming_node_and_rank(emu):
    c = emu(2)
    c.start_executors()
    res = c.run("--rdzv-port", free_rdzv_port(c), "--fail-grace", "3", "--",
                str(JOBS / "fail_on_node.py"), "--fail-node", "1", "--code", "1")
    worker = c.addresses[1]
    assert res.returncode == 1, res.stdout
    failed = [line for line in res.stdout.splitlines() if line.startswith("[dl-run] job ")
              and "FAILED" in line]
    assert len(failed) == 1, res.stdout
    # The cause comes first: node rank 1 at the worker's address.
    assert re.search(rf"FAILED: node rank 1 \({re.escape(worker)}\) exited with code 1", failed[0])
    assert f"[1 {worker}] node=1" in res.stdout
    (jdir,) = c.job_dirs()
    assert store.read_record(JobPaths(jdir).exit(1), ShareExit).returncode == 1


def test_plain_command_on_three_nodes_reports_each_exit(emu):
    c = emu(3)
    c.start_executors()
    res = c.run("--launcher", "each", "--fail-grace", "1", "--",
                PYTHON, str(JOBS / "fail_on_node.py"), "--fail-node", "2", "--code", "3")
    assert res.returncode == 1, res.stdout
    for rank, addr in enumerate(c.addresses):
        assert f"[{rank} {addr}] node={rank} rank=-" in res.stdout
    assert f"node rank 2 ({c.addresses[2]}) exited with code 3" in res.stdout
    assert "node rank 0" not in res.stdout.split("FAILED")[1]


def test_sigterm_to_the_runner_stops_every_process_of_the_job(emu):
    c = emu(2)
    c.start_executors()
    p = c.popen_runner("--rdzv-port", free_rdzv_port(c), "--grace", "3", "--",
                       str(JOBS / "sleeper.py"))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 90
    while sum("ready node=" in line for line in lines) < 2:
        assert p.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "ranks never became ready:\n" + "".join(lines)
        time.sleep(0.1)
    job_pids = c.job_pids()
    reported = {int(x) for line in lines for x in re.findall(r"(?:pid|child)=(\d+)", line)}
    assert len(reported) == 4
    assert reported <= job_pids  # torchrun's workers (own sessions) and their children too
    assert len(job_pids) >= 6  # per node: torchrun agent, worker, worker's child

    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 143
    reader.join(timeout=10)
    out = "".join(lines)
    assert "cancelled (SIGTERM)" in out
    still = [pid for pid in job_pids if alive(pid)]
    assert not still, f"still alive after dl-run exited: {still}\n{out}"
    (jdir,) = c.job_dirs()
    assert store.exists(JobPaths(jdir).cancel)
    for rank in (0, 1):
        assert store.read_record(JobPaths(jdir).exit(rank), ShareExit).cancelled is True


def test_node_without_executor_fails_fast_naming_its_address(emu):
    c = emu(3)
    missing = c.addresses[2]
    c.start_executors(c.addresses[:2])
    t0 = time.monotonic()
    res = c.run("--", "train.py")
    elapsed = time.monotonic() - t0
    assert res.returncode == 3, res.stdout
    assert f"cannot reach node(s) {missing}" in res.stdout
    assert c.addresses[1] not in res.stdout.split("cannot reach")[1].split("(")[0]
    assert c.job_dirs() == []  # nothing was published, nothing started
    print(f"unreachable node detected in {elapsed:.1f} s")


def test_node_lost_after_start_fails_the_job_naming_it(emu):
    c = emu(2)
    c.start_executors()
    worker = c.addresses[1]
    # The worker's executor dies hard: its last heartbeat is recent, but it stops moving.
    os.killpg(c.executors[worker].pid, signal.SIGKILL)
    c.executors[worker].wait()
    res = c.run("--launcher", "each", "--heartbeat-timeout", "2", "--start-timeout", "20",
                "--grace", "1", "--", "sleep", "60")
    assert res.returncode == 1, res.stdout
    assert f"node rank 1 ({worker})" in res.stdout
    assert "heartbeat stopped" in res.stdout


def test_dry_run_prints_commands_and_starts_nothing(emu):
    c = emu(2, gpus=8)
    res = c.run("--dry-run", "--torchrun-max-restarts", "3", "--", "-m", "pkg.train", "--epochs",
                "1")
    assert res.returncode == 0, res.stdout
    assert "[dl-run] job torchrun-" in res.stdout
    for node in c.membership.nodes:
        assert f"# node {node.rank} {node.address}" in res.stdout
        assert f"--local-addr={node.address}" in res.stdout
    assert res.stdout.count("--nproc-per-node=8") == 2
    assert "--max-restarts=3" in res.stdout
    assert not ClusterPaths(c.efs).jobs_dir.exists()


def test_executor_does_not_replay_an_old_job_after_restart(emu):
    c = emu(1)
    c.start_executors()
    res = c.run("--launcher", "each", "--", "true")
    assert res.returncode == 0, res.stdout
    (jdir,) = c.job_dirs()
    addr = c.addresses[0]
    os.killpg(c.executors[addr].pid, signal.SIGTERM)
    c.executors[addr].wait(timeout=20)
    # Forge an unfinished job from a runner that died: no heartbeat will ever move.
    stale = ClusterPaths(c.efs).job("stale-job")
    spec = JobSpec.from_json(store.read_text(JobPaths(jdir).spec) or "")
    store.atomic_write(stale.spec, JobSpec(**{**spec.__dict__, "job_id": "stale-job"}).to_json())
    store.write_record(stale.runner_heartbeat, RunnerHeartbeat(seq=7))
    c.start_executors([addr])
    time.sleep(4.5)  # longer than the executor's start-up liveness window
    assert not stale.nodes.exists() or not list(stale.nodes.iterdir())

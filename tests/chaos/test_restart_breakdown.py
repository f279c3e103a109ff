"""Where one elastic restart's seconds go, phase by phase (``make bench``; docs/runner.md,
"One restart, phase by phase").

Real processes, no emulated cluster: four torchrun agents on loopback addresses with the
product's torchrun command line (``launchers.torchrun_argv`` for an elastic job, one worker
per node as on the emulated nodes) and the product's rendezvous store process, running the
example as the goodput bench does. One node's agent and worker are SIGKILLed (its machine
gone): the survivors restart; then a fifth node's agent starts (the replacement joins):
every worker restarts. torchrun's log and the example's phases are timestamped by
``jobs/timed_agent.py`` and ``jobs/timed_digits.py``; ``restart_phases`` splits each
restart at the last node's boundary. Printed, never asserted on.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine import launchers as ln
from bootstrap_scripts.jobs.engine.plan_types import LaunchOptions
from bootstrap_scripts.jobs.engine.rdzv_store import RDZV_STORE_SCRIPT
from bootstrap_scripts.protocol.nnodes import ELASTIC_MAX_NODES, NodeRange
from emulator.cloud import free_port
from tests.chaos import restart_phases as rp

ROOT = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).resolve().parent / "jobs"
RUNS = 2
FIRST_STEP = re.compile(r"^WK (\d+\.\d+) rank=0 out first_step rank=0 world_size=(\d+)")


class Master:
    """What ``torchrun_argv`` reads of a membership."""

    def __init__(self, address: str) -> None:
        self.master_addr = address


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (torch starts its workers in sessions of their own,
    so a process group would miss them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def kill_tree(pid: int) -> None:
    for p in descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


class Job:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        net = 31 + os.getpid() % 200
        self.addresses = [f"127.31.{net}.{i}" for i in range(2, 7)]
        self.port = free_port(self.addresses[0])
        self.env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                    "DL_CHECKPOINT_DIR": str(tmp / "checkpoints"), "PYTHONPATH": str(ROOT),
                    "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO"}
        self.procs: dict[int, subprocess.Popen] = {}
        self.store = subprocess.Popen([sys.executable, RDZV_STORE_SCRIPT, "--host",
                                       self.addresses[0], "--port", str(self.port)],
                                      env=self.env, start_new_session=True)

    def start(self, i: int) -> float:
        opts = LaunchOptions(job_id="restart", python=sys.executable, elastic=True,
                             rdzv_port=self.port, rdzv_last_call=ln.ELASTIC_LAST_CALL)
        argv = list(ln.torchrun_argv(
            opts, Master(self.addresses[0]),
            [str(JOBS / "timed_digits.py"), "--epochs", "20", "--checkpoint-every", "4",
             "--step-delay", "0.25"],
            address=self.addresses[i], nproc=1, nnodes=NodeRange(1, ELASTIC_MAX_NODES),
            max_restarts=ln.ELASTIC_MAX_RESTARTS))
        assert argv[1] == ln.TORCHRUN_AGENT_SCRIPT  # an elastic job's agent: torchrun
        argv[1:2] = [str(JOBS / "timed_agent.py")]
        log = (self.tmp / f"node{i}.log").open("w")
        started = time.time()
        self.procs[i] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         env={**self.env, "RESTART_NODE": f"node{i}"},
                                         start_new_session=True)
        return started

    def lines(self) -> list[str]:
        return [line for i in self.procs
                for line in (self.tmp / f"node{i}.log").read_text(errors="replace").splitlines()]

    def training(self, since: float, world: int, timeout: float = 180) -> float:
        end = time.time() + timeout
        while time.time() < end:
            for line in self.lines():
                m = FIRST_STEP.match(line)
                if m and float(m.group(1)) > since and int(m.group(2)) == world:
                    return float(m.group(1))
            time.sleep(0.2)
        raise AssertionError(f"not training at world size {world} within {timeout} s:\n"
                             + "\n".join(self.lines()[-40:]))

    def stop(self) -> None:
        for p in self.procs.values():
            kill_tree(p.pid)
        kill_tree(self.store.pid)
        for p in (*self.procs.values(), self.store):
            p.wait(timeout=30)


def one_run(tmp: Path) -> tuple[list[tuple[str, float]], ...]:
    """The loss's and the join's phases (wall seconds), then their workers' CPU seconds."""
    job = Job(tmp)
    try:
        t = min(job.start(i) for i in range(4))
        job.training(t, 4)
        time.sleep(6)
        killed = time.time()
        kill_tree(job.procs[3].pid)
        job.training(killed, 3)
        time.sleep(6)
        joined = job.start(4)
        job.training(joined, 4)
        evs = rp.events(job.lines())
        seen = rp.seen_waiting(evs, joined)
        return (rp.phases(evs, killed, joined), rp.phases(evs, seen),
                rp.worker_cpu(evs, killed), rp.worker_cpu(evs, seen))
    finally:
        job.stop()


@pytest.mark.bench
def test_bench_one_elastic_restart_phase_by_phase(tmp_path):
    runs = []
    for n in range(RUNS):
        (tmp_path / str(n)).mkdir()
        runs.append(one_run(tmp_path / str(n)))
    print(f"\nOne elastic restart, phase by phase (seconds; last_call_timeout="
          f"{ln.ELASTIC_LAST_CALL:g} s, keep-alive {ln.ELASTIC_KEEP_ALIVE_S} s x "
          f"{ln.ELASTIC_KEEP_ALIVE_ATTEMPTS}; load average {os.getloadavg()[0]:.1f}):")
    print(f"  {'phase':58s} " + " ".join(f"{'loss ' + str(n + 1):>7s}" for n in range(RUNS))
          + " " + " ".join(f"{'join ' + str(n + 1):>7s}" for n in range(RUNS)))
    for k, (name, _s) in enumerate(runs[0][0]):
        print(f"  {name:58s} " + " ".join(f"{r[0][k][1]:7.2f}" for r in runs) + " "
              + " ".join(f"{r[1][k][1]:7.2f}" for r in runs))
    print(f"  {'total: the kill (loss) / an agent saw the node (join) -> first step':58s} "
          + " ".join(f"{rp.total(r[0]):7.2f}" for r in runs) + " "
          + " ".join(f"{rp.total(r[1]):7.2f}" for r in runs))
    print("  the workers' own CPU seconds in their start (mean over the ranks; wall time above "
          "also holds other processes' work):")
    for k, (name, _s) in enumerate(runs[0][2]):
        print(f"  {'  ' + name:58s} " + " ".join(f"{r[2][k][1]:7.2f}" for r in runs) + " "
              + " ".join(f"{r[3][k][1]:7.2f}" for r in runs))
    print(f"  {'  total':58s} " + " ".join(f"{sum(s for _n, s in r[2]):7.2f}" for r in runs)
          + " " + " ".join(f"{sum(s for _n, s in r[3]):7.2f}" for r in runs))

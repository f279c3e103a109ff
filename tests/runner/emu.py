"""Emulated nodes for runner tests: one root dir + one executor process per node, one EFS dir.

Each node's files are rendered exactly as the node agent does (``build_membership`` +
``render_node_files``); each executor is bound to its own 127.20.x address. Every process
started here is tracked by PID / process group and stopped (and checked dead) at teardown.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts import job_spec as js
from bootstrap_scripts.membership import Membership, build_membership, render_node_files
from tests.conftest import REPO_ROOT, free_port

PYTHON = sys.executable
_cluster_numbers = itertools.count()


def addresses_for(n_nodes: int) -> list[str]:
    """Distinct addresses per cluster of a session (master 127.20.0.x, workers 127.20.128.x),
    so a test never meets a previous test's lingering socket."""
    k = next(_cluster_numbers) % 12
    base = 13 * (os.getpid() % 19)  # other pytest sessions on the machine pick other hosts
    master = f"127.20.0.{(100 + base + k) % 250 + 2}"
    workers = [f"127.20.128.{(base + 8 * k + i) % 250 + 2}" for i in range(n_nodes - 1)]
    return [master, *workers]


def proc_pgid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def pids_in_groups(pgids: set[int]) -> set[int]:
    """Every live (non-zombie) process whose process group is one of ``pgids``."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) in pgids:
                found.add(int(entry))
    return found


def pids_of_jobs_under(efs: Path) -> set[int]:
    """Live processes started for any job of this EFS (they carry DL_JOB_DIR=<efs>/jobs/..),
    whatever process group or session they moved to."""
    needle = f"\0DL_JOB_DIR={js.jobs_dir(efs)}/".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    data = b"\0" + fh.read()
            except OSError:
                continue
            if needle in data and alive(int(entry)):
                found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = os.path.dirname(PYTHON) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class EmuCluster:
    tmp: Path
    membership: Membership
    efs: Path
    roots: dict[str, Path]
    executors: dict[str, subprocess.Popen] = field(default_factory=dict)
    others: list[subprocess.Popen] = field(default_factory=list)
    pgids: set[int] = field(default_factory=set)
    pids: set[int] = field(default_factory=set)

    @property
    def master_root(self) -> Path:
        return self.roots[self.membership.master_addr]

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.membership.nodes]

    def start_executors(self, addresses: list[str] | None = None, *, wait: bool = True) -> None:
        for addr in addresses or self.addresses:
            log = open(self.tmp / f"executor-{addr}.log", "ab")  # noqa: SIM115
            p = subprocess.Popen(
                [PYTHON, "-m", "bootstrap_scripts.executor", "--root", str(self.roots[addr]),
                 "--mount-point", str(self.efs), "--address", addr, "--no-mount"],
                cwd=REPO_ROOT, env=base_env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
            log.close()
            self.executors[addr] = p
            self.pgids.add(p.pid)
            self.pids.add(p.pid)
        if wait:
            deadline = time.monotonic() + 30
            for addr in addresses or self.addresses:
                while js.read_json(js.executor_heartbeat_path(self.efs, addr)) is None:
                    assert self.executors[addr].poll() is None, self.executor_log(addr)
                    assert time.monotonic() < deadline, f"executor {addr} never heartbeat"
                    time.sleep(0.05)

    def executor_log(self, addr: str) -> str:
        return (self.tmp / f"executor-{addr}.log").read_text(errors="replace")

    def runner_argv(self, *args: str) -> list[str]:
        return [PYTHON, "-m", "bootstrap_scripts.runner", "--root", str(self.master_root), *args]

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        p = self.popen_runner(*args)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group(p.pid)
            out, _ = p.communicate()
            raise AssertionError(f"dl-run timed out; output so far:\n{out}") from None
        return subprocess.CompletedProcess(p.args, p.returncode, out, "")

    def popen_runner(self, *args: str) -> subprocess.Popen:
        p = subprocess.Popen(self.runner_argv(*args), cwd=REPO_ROOT, env=base_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.others.append(p)
        self.pgids.add(p.pid)
        self.pids.add(p.pid)
        return p

    def job_dirs(self) -> list[Path]:
        return sorted(p for p in js.jobs_dir(self.efs).glob("*") if p.is_dir())

    def share_pgids(self) -> set[int]:
        """Process groups of every share any executor started (from the acknowledgements)."""
        groups = set()
        for started in js.jobs_dir(self.efs).glob("*/nodes/*.started"):
            rec = json.loads(started.read_text())
            if rec.get("pgid"):
                groups.add(int(rec["pgid"]))
        return groups

    @staticmethod
    def kill_group(pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)

    def stop(self) -> None:
        """TERM every executor (they stop their shares), then KILL whatever is left."""
        self.pgids |= self.share_pgids()
        for p in [*self.others, *self.executors.values()]:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in [*self.others, *self.executors.values()]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill_group(p.pid)
                p.wait(timeout=10)
        self.pgids |= self.share_pgids()
        deadline = time.monotonic() + 10
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pgid in self.pgids:
            self.kill_group(pgid)
        for pid in pids_of_jobs_under(self.efs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def leftovers(self) -> set[int]:
        return ({p for p in self.pids if alive(p)} | pids_in_groups(self.pgids)
                | pids_of_jobs_under(self.efs))


def make_cluster(tmp: Path, n_nodes: int, gpus: int = 0) -> EmuCluster:
    efs = tmp / "efs"
    efs.mkdir(parents=True)
    addrs = addresses_for(n_nodes)
    m = build_membership(
        cluster_id="runner-test", generation=1,
        master={"instance_id": "i-master", "address": addrs[0], "gpus": gpus},
        workers=[{"instance_id": f"i-worker{k}", "address": a, "gpus": gpus}
                 for k, a in enumerate(addrs[1:])],
        efs_mount=str(efs))
    roots = {}
    for node in m.nodes:
        root = tmp / f"node{node.rank}"
        for rel, content in render_node_files(m, node, root=root).items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        roots[node.address] = root
    return EmuCluster(tmp, m, efs, roots)


def free_rdzv_port(cluster: EmuCluster) -> str:
    return str(free_port(cluster.membership.master_addr))

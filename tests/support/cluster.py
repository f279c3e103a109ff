"""An emulated cluster for the job runner's tests: N nodes that run jobs, no AWS at all.

Every node is an executor-only ``emulator.nodes.Node`` (its own root, the real installer, the
``dl-executor.service`` process) on an address ``emulator.resources.loopback_instances``
hands out; the nodes share one EFS directory. The node agent's part is played with the
agent's own code: :meth:`LocalCluster.publish` applies a membership on every node
(``Node.apply``). ``dl-run`` is the master's installed wrapper (``--unmanaged`` unless a test
asks for a managed job); :meth:`LocalCluster.start_controller` starts the master's job
controller unit. Every process started here, every attempt runner a controller started, and
every process of a job's shares, is stopped through ``bootstrap_scripts.node.procgroup``.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts.agent.install import BIN_DIR
from bootstrap_scripts.node.procgroup import (
    Tracked,
    alive,
    pids_in_groups,
    pids_with_token,
    share_token,
    stop_groups,
    stop_popen_group,
    sweep_share,
)
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.paths import (
    SHARE_STARTED_SUFFIX,
    ClusterPaths,
    JobPaths,
    NodePaths,
)
from bootstrap_scripts.protocol.records import DrainRecord, RunnerHeartbeat, ShareStarted
from emulator.deploy import Instance
from emulator.nodes import Node, base_env, stop_nodes
from emulator.resources import agent_settings, install_args, loopback_instances
from emulator.units import CONTROLLER_UNIT
from tests.conftest import REPO_ROOT, free_port

CLUSTER_ID = "runner-test"


def job_dirs(efs: Path) -> list[Path]:
    """Every job directory on ``efs``, of every user: ``jobs/<user>/<id>/``."""
    jobs = ClusterPaths(efs).jobs_dir
    return sorted(p for u in (jobs.iterdir() if jobs.is_dir() else ()) if u.is_dir()
                  and not u.is_symlink() for p in u.iterdir() if p.is_dir()
                  and not p.is_symlink())


@dataclass
class LocalCluster:
    tmp: Path
    efs: Path
    nodes: list[Node]
    membership: Membership  # generation 1: every node
    gpus: int = 0
    runners: list[subprocess.Popen] = field(default_factory=list)
    #: other processes a test started and wants stopped and checked (e.g. sshd), by group
    pgids: set[int] = field(default_factory=set)
    pids: set[int] = field(default_factory=set)

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.membership.nodes]

    @property
    def roots(self) -> dict[str, Path]:
        return {n.address: n.root for n in self.nodes}

    @property
    def master_root(self) -> Path:
        return self.roots[self.membership.master_addr]

    @property
    def executors(self) -> dict[str, subprocess.Popen]:
        return {n.address: n.executor for n in self.nodes if n.executor is not None}

    def node(self, address: str) -> Node:
        return next(n for n in self.nodes if n.address == address)

    def publish(self, generation: int, addresses: list[str], reason: str = "") -> Membership:
        """What the agents do for a new generation: every member applies it (the master
        first, then workers as listed); a node left out keeps the files it had."""
        m = membership_of([self.node(a) for a in addresses], self.efs, self.gpus, generation,
                          reason or f"generation {generation}")
        for node in self.nodes:
            node.apply(m)
        return m

    def drain(self, record: DrainRecord) -> None:
        """What the agents do for a drain: the master's record on EFS, and the drained
        node's agent's copy on its own disk, which its executor acts on (unsigned: these
        nodes have no key; the signature check is ``worker.accept_drain``'s, tested there)."""
        state.write_drain(self.efs, record)
        store.write_record(NodePaths(self.node(record.address).root).applied_drain, record)

    def start_executors(self, addresses: list[str] | None = None, *, wait: bool = True) -> None:
        """Start (or restart) the executors of ``addresses`` (default: every node) and wait
        for their first heartbeat."""
        chosen = [self.node(a) for a in addresses or self.addresses]
        for node in chosen:
            node.start_executor()
        deadline = time.monotonic() + 30
        for node in chosen if wait else ():
            beat = ClusterPaths(self.efs).executor_heartbeat(node.address)
            while not store.exists(beat):
                assert node.executor and node.executor.poll() is None, \
                    self.executor_log(node.address)
                assert time.monotonic() < deadline, f"executor {node.address} never heartbeat"
                time.sleep(0.05)

    def executor_log(self, address: str) -> str:
        return self.node(address).log_path("dl-executor").read_text(errors="replace")

    def start_controller(self, aws: dict[str, str] | None = None, *,
                         health_gate: bool = False) -> subprocess.Popen:
        """Start (or restart) the master's ``dl-controller.service`` process, with ``aws``
        (endpoint, credentials) in its environment, and wait for its first heartbeat.
        Without ``health_gate`` the unit gets ``--no-health-gate`` (executor-only nodes have
        no GPU tools for the gate to check)."""
        master = self.node(self.membership.master_addr)
        master.env = {**master.env, **(aws or {})}
        unit = master.root / CONTROLLER_UNIT
        text = unit.read_text()
        if not health_gate and "--no-health-gate" not in text:
            unit.write_text(re.sub(r"^(ExecStart=.*)$", r"\1 --no-health-gate", text,
                                   flags=re.M))
        beat = ClusterPaths(self.efs).controller_heartbeat
        before = store.stamp(beat)
        p = master.start_controller()
        deadline = time.monotonic() + 30
        while store.stamp(beat) in (None, before):
            assert p.poll() is None, master.log_path("dl-controller").read_text()
            assert time.monotonic() < deadline, "the job controller never heartbeat"
            time.sleep(0.05)
        return p

    @property
    def controller(self) -> subprocess.Popen | None:
        return self.node(self.membership.master_addr).procs.get("controller")

    def controller_log(self) -> str:
        path = self.node(self.membership.master_addr).log_path("dl-controller")
        return path.read_text(errors="replace") if path.exists() else ""

    def dl_jobs(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        """``dl-jobs --root <master> ARGS`` through the master's installed wrapper."""
        return subprocess.run([str(self.master_root / BIN_DIR / "dl-jobs"), "--root",
                               str(self.master_root), *args], cwd=REPO_ROOT, env=base_env(),
                              text=True, capture_output=True, timeout=timeout)

    def popen_runner(self, *args: str, managed: bool = False) -> subprocess.Popen:
        """``dl-run --root <master> ARGS`` through the master's installed wrapper
        (``--unmanaged`` unless ``managed``)."""
        p = subprocess.Popen([str(self.master_root / BIN_DIR / "dl-run"), "--root",
                              str(self.master_root), *(() if managed else ("--unmanaged",)),
                              *args], cwd=REPO_ROOT, env=base_env(),
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.runners.append(p)
        return p

    def run(self, *args: str, timeout: float = 180, managed: bool = False
            ) -> subprocess.CompletedProcess:
        p = self.popen_runner(*args, managed=managed)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_popen_group(p)
            out, _ = p.communicate()
            raise AssertionError(f"dl-run timed out; output so far:\n{out}") from None
        return subprocess.CompletedProcess(p.args, p.returncode, out, "")

    def job_dirs(self) -> list[Path]:
        """Every job directory of every user (``jobs/<user>/<id>/``)."""
        return job_dirs(self.efs)

    def _shares(self) -> list[tuple[int, str]]:
        """(process group, share token) of every share a job listed or an executor started."""
        found: dict[str, int] = {}
        for jdir in self.job_dirs():
            paths = JobPaths(jdir)
            try:
                text = store.read_text(paths.spec)
                shares = JobSpec.from_json(text).shares if text else ()
            except ProtocolError:  # a spec the executors refuse (a drill's link, FIFO,
                #                    garbage): nothing started
                shares = ()
            for share in shares:
                found.setdefault(share_token(paths.key, share.rank, share.address), 0)
            for _stem, rec in store.scan_records(paths.nodes, ShareStarted,
                                                 suffix=SHARE_STARTED_SUFFIX):
                found[share_token(paths.key, rec.rank, rec.address)] = rec.pgid
        return [(pgid, token) for token, pgid in found.items()]

    def share_pgids(self) -> set[int]:
        """Process groups of every share any executor started (from its acknowledgement)."""
        return {pgid for pgid, _token in self._shares() if pgid}

    def job_pids(self) -> set[int]:
        """Every live process of any job's shares, whatever group or session it moved to."""
        shares = self._shares()
        return pids_in_groups(pgid for pgid, _ in shares if pgid) | {
            pid for _, token in shares for pid in pids_with_token(token) if alive(pid)}

    def attempt_runners(self) -> set[int]:
        """Live runners of any job (a controller's attempts run in sessions of their own):
        those that beat, and those started on this cluster's EFS that have not beaten yet
        (a runner writes its first heartbeat only once its spec is out)."""
        pids = set()
        for jdir in self.job_dirs():
            beat = store.read_record_or_none(JobPaths(jdir).runner_heartbeat, RunnerHeartbeat)
            if beat and beat.pid and alive(beat.pid):
                pids.add(beat.pid)
        return pids | runners_on(self.efs)

    def stop(self) -> None:
        """dl-run processes, then every node (its executor stops its shares, its controller
        its attempt), then whatever a share or a test left; everything by PID or group.
        Attempt runners are looked for again once the controller stopped: one it started
        while it was being stopped (its runner outlives it, by design, for the next
        controller to take over) would otherwise be left running."""
        attempts = self.attempt_runners()
        stop_nodes(self.nodes, grace=20, also=[
            Tracked("dl-run", p.pid, None) for p in self.runners if p.poll() is None])
        attempts |= self.attempt_runners()
        stop_groups([Tracked("attempt runner", pid, None) for pid in attempts
                     if alive(pid)], grace=10)
        for pgid, token in self._shares():
            sweep_share(pgid, token)
        stop_groups([Tracked("test process", pgid, None) for pgid in self.pgids], grace=5)

    def leftovers(self) -> set[int]:
        groups = {g.pid for n in self.nodes for g in n.groups} | self.pgids | {
            p.pid for p in self.runners}
        return ({p for p in self.pids if alive(p)} | pids_in_groups(groups) | self.job_pids()
                | self.attempt_runners())


def runners_on(efs: Path) -> set[int]:
    """Live attempt runners (``dl-run --unmanaged ... --mount-point EFS``, as the job
    controller starts them) of the cluster whose EFS is ``efs``: its path is this test's own
    temporary directory, so no other test's process matches."""
    needle = f"\0--mount-point\0{efs}\0".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = b"\0" + fh.read()
        except OSError:
            continue
        if b"bootstrap_scripts.jobs.cli.dl_run" in cmdline and needle in cmdline:
            found.add(int(entry))
    return {pid for pid in found if alive(pid)}


def start_local_cluster(tmp: Path, n_nodes: int, gpus: int = 0, *,
                        instances: list[Instance] | None = None) -> LocalCluster:
    """``n_nodes`` nodes (the first the master) with generation 1 applied and the installer
    run; no executor started yet (:meth:`LocalCluster.start_executors`). ``instances``:
    the nodes' instances (e.g. moto's, for a test whose controller calls Auto Scaling);
    default: loopback addresses and made-up ids."""
    efs = tmp / "efs"
    efs.mkdir(parents=True, exist_ok=True)  # a test may have mounted a file system there
    instances = instances or loopback_instances(n_nodes)
    nodes = [Node(inst, "master" if k == 0 else "worker", tmp / f"node{k}", efs, tmp / "logs")
             for k, inst in enumerate(instances[:n_nodes])]
    for node in nodes:
        node.install(install_args(agent_settings(node.role, cluster_id=CLUSTER_ID,
                                                 mount_point=str(efs))))
    m = membership_of(nodes, efs, gpus, 1, "initial")
    for node in nodes:
        node.apply(m)
    return LocalCluster(tmp, efs, nodes, m, gpus)


def membership_of(nodes: list[Node], efs: Path, gpus: int, generation: int,
                  reason: str) -> Membership:
    """The membership the master agent would publish for ``nodes`` (the first the master)."""
    master, *workers = nodes
    return build_membership(
        cluster_id=CLUSTER_ID, generation=generation, efs_mount=str(efs), reason=reason,
        master={"instance_id": master.instance_id, "address": master.address, "gpus": gpus},
        workers=[{"instance_id": n.instance_id, "address": n.address, "gpus": gpus}
                 for n in workers])


def free_rdzv_port(cluster: LocalCluster) -> str:
    """A free port on the master's address for the torchrun rendezvous."""
    return str(free_port(cluster.membership.master_addr))

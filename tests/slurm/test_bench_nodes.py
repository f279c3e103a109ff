"""Benchmark, REAL PROCESSES: Slurm-ready after the last node starts, 64 nodes.

Every node is what ``tests/support/slurm.py`` makes of it: its own root directory and
127.x address, its munge key written by the product, its units rendered by the product's
installer code (``bootstrap_scripts.slurm.units``) and started as the emulator starts them
(``emulator.slurm_node``: the unit's ``ExecStart``, i.e. ``dl-slurm-daemon`` waiting for
its inputs and then ``exec``-ing the real daemon); its slurm.conf written by the product
(``node.write_config``) for the membership this harness publishes. Per node a real
``munged`` and a real ``slurmd -D -Z -N ip-a-b-c-d`` (Debian's 22.05) registering as a
dynamic node with the master's real ``slurmctld``; each slurmd listens on port 6818 of its
node's own address.

Figures (nothing asserts a time; "IDLE" is the node's state in ``scontrol show nodes``,
which ``sinfo`` shows, polled every 0.1 s, so each figure is late by up to that):

- **wave**: the membership of all 64 is published (every node's slurm.conf written, as each
  agent does when it applies the generation), the master's units are started and its node is
  IDLE; then the 63 workers' units are started one after another with no pause (a formation:
  every instance finishing its boot at about the same time). Figure = the last worker's
  units started -> all 64 IDLE; the first start -> all 64 IDLE is printed too. On two cores
  the 126 daemons' start-up work queues (each unit first runs an interpreter); on AWS each
  node has CPUs of its own.
- **last node alone**: one worker stopped and started again once the others are quiet (a
  replacement joining a warm cluster). Figure = its units started -> it IDLE.

The node count is ``SLURM_BENCH_NODES`` (default 64). Run with ``make bench``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator import slurm_node
from emulator.node_network import bind_preload
from emulator.resources import loopback_instances
from tests.agent.bench_support import cpu_seconds, rss_mib
from tests.support.slurm import SlurmNodes, SlurmTestNode, slurm_work

pytestmark = pytest.mark.bench

NODES = int(os.environ.get("SLURM_BENCH_NODES", "64"))
POLL_S = 0.1
HOW = ("REAL PROCESSES: per node a real munged and a real slurmd -Z (Debian's Slurm 22.05) "
       "from the product's units, at its own 127.x address; one real slurmctld")


@pytest.fixture()
def slurm(tmp_path: Path) -> Iterator[SlurmNodes]:
    with slurm_work() as work:
        nodes = SlurmNodes(work, bind_preload(tmp_path / "lib"))
        try:
            yield nodes
        finally:
            assert not nodes.stop(), "Slurm processes outlived the benchmark"


def idle_at(slurm: SlurmNodes, names: set[str], timeout: float) -> float:
    """Until every one of ``names`` is IDLE; the monotonic time it was first seen so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = {x.name: x for x in slurm.slurm_nodes() or []}
        if all(n in listed and "IDLE" in listed[n].states for n in names):
            return time.monotonic()
        time.sleep(POLL_S)
    listed = {x.name: x for x in slurm.slurm_nodes() or []}
    missing = sorted(n for n in names if "IDLE" not in getattr(listed.get(n), "states", ()))
    raise AssertionError(f"{len(missing)} of {len(names)} nodes not IDLE after {timeout:g} s: "
                         f"{missing[:8]}; logs under {slurm.work}")


def test_slurm_ready_after_the_last_node_starts_real_slurmd(slurm: SlurmNodes) -> None:
    master_i, *worker_is, spare_i = loopback_instances(NODES + 1)
    master = slurm.add("master", master_i.address)
    workers = [slurm.add("worker", i.address, gpus=4, instance_type="g5.12xlarge")
               for i in worker_is]
    slurm.publish()  # every node's slurm.conf, as each agent writes it for generation 1
    slurm.start(master)
    idle_at(slurm, {master.name}, 60)

    load = os.getloadavg()[0]
    first = time.monotonic()
    for n in workers:
        slurm.start(n)
    last = time.monotonic()
    everyone = {n.name for n in slurm.nodes}
    ready = idle_at(slurm, everyone, 300)
    daemons = sorted(set().union(*(slurm_node.processes(n.address) for n in slurm.nodes)))
    ctld = [p for p in daemons if Path(cmdline(p).split(" ")[0]).name == "slurmctld"]
    ctld_cpu = cpu_seconds(ctld)
    ctld_log = (slurm.paths(master).log_dir / "slurmctld.log").read_text()
    rebuilds = ctld_log.count("select_p_reconfigure")

    # a replacement joining the warm cluster: a worker's machine lost, its record deleted
    # (as the master's reconcile deletes it), a new node at a new address in the membership
    time.sleep(2.0)
    victim = workers[-1]
    slurm.lose(victim)
    deleted = delete_record(slurm, victim)
    spare = slurm.add("worker", spare_i.address, gpus=4, instance_type="g5.12xlarge")
    slurm.publish()
    t = time.monotonic()
    slurm.start(spare)
    alone = idle_at(slurm, {spare.name}, 120) - t

    print(f"\n[bench] Slurm-ready, {HOW}; load average {load:.1f} before the wave; "
          f"{os.cpu_count()} cores")
    print(f"[bench] {NODES} nodes: last worker's units started -> all {NODES} IDLE  "
          f"{ready - last:6.2f} s")
    print(f"[bench] {NODES} nodes: first worker's units started -> all {NODES} IDLE "
          f"{ready - first:6.2f} s  (the starts themselves took {last - first:.2f} s)")
    print(f"[bench] one node joining the warm {NODES}-node cluster: units started -> IDLE "
          f"{alone:6.2f} s  (the lost node's delete: {deleted})")
    print(f"[bench] daemons: {len(daemons)} processes, {rss_mib(daemons):.0f} MiB RSS; "
          f"slurmctld's CPU until all were IDLE {ctld_cpu:.2f} s "
          f"({ctld_cpu / NODES * 1000:.1f} ms a node); its select plugin rebuilt "
          f"{rebuilds} times (slurmctld.log's select_p_reconfigure)")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def delete_record(slurm: SlurmNodes, n: SlurmTestNode) -> str:
    """The lost node's record deleted, as the master's reconcile deletes it."""
    res = subprocess.run(["scontrol", "delete", f"NodeName={n.name}"], env=slurm.env(),
                         capture_output=True, text=True, timeout=30, check=False)
    return "ok" if res.returncode == 0 else res.stderr.strip()

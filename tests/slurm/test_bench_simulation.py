"""Benchmark, SIMULATION (one process, no daemons): the product's own Slurm code for 1,024
and 4,096 nodes, fed generated memberships and a generated Slurm node list.

What grows with the cluster in the product's part of "Slurm-ready" is small, and this times
exactly that part, with the product's functions, nothing else:

- **each node, when it applies the membership** (in parallel on a cluster, one per node):
  ``node.write_config`` renders and writes slurm.conf, gres.conf, cgroup.conf, the
  TaskProlog and the Prolog (slurm.conf names no node: dynamic nodes), then its slurmd unit
  (``daemons.plan``) starts. Timed: one node's first write (every file new) and a rewrite
  with nothing changed (what every node does again at each later generation);
- **the master's reconcile pass** (after each membership it applies and on every heartbeat,
  5 s): ``reconcile.parse_nodes`` of ``scontrol show nodes -o`` (N lines in Slurm 22.05's
  own format, generated from a line a real slurmctld printed here), ``reconcile.plan``
  against the N-node membership, ``reconcile.health_drained``, ``Reconciler.remember``:
  steady state (every member IDLE: nothing to do), and one node lost (its DOWN + delete);
- **the prolog's own lookup** at every job start (``prolog.own_node``: the node's
  membership read from disk, its entry found), which grows with N too.

What it does not measure: ``scontrol``'s and ``squeue``'s own runs and slurmctld's answer
to them, slurmctld registering N dynamic nodes (Slurm's own work: the real-process bench
``test_bench_nodes.py`` measures it at 64 nodes and more), the agent's membership (the
agent's simulation, ``tests/agent/test_bench_simulation.py``), EC2's boot, the network.
Run with ``make bench``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bootstrap_scripts.protocol.membership import Membership, Node, alias_for
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import names, node, prolog, reconcile

pytestmark = pytest.mark.bench

SIZES = (1024, 4096)
REPS = 5
HOW = ("SIMULATION: one process, the product's Slurm functions in-process (no daemons, no "
       "scontrol run), generated memberships and node lists")
#: One node as ``scontrol show nodes -o`` printed it (Slurm 22.05.8, a dynamic node of the
#: emulated cluster), with its name and address made placeholders.
LINE = ("NodeName={name} Arch=x86_64 CoresPerSocket=96  CPUAlloc=0 CPUEfctv=96 CPUTot=96 "
        "CPULoad=0.10 AvailableFeatures=worker,p4d_24xlarge ActiveFeatures=worker,p4d_24xlarge "
        "Gres=gpu:8 NodeAddr={addr} NodeHostName={name} Version=22.05.8 OS=Linux "
        "6.1.0 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1160000 AllocMem=0 FreeMem=1150000 "
        "Sockets=2 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
        "MCS_label=N/A Partitions=train,workers  BootTime=2026-12-08T02:30:00 "
        "SlurmdStartTime=2026-12-08T02:37:44 LastBusyTime=2026-12-08T02:37:44 "
        "CfgTRES=cpu=96,mem=1160000M,billing=96 AllocTRES= CapWatts=n/a CurrentWatts=0 "
        "AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")


def address(k: int) -> str:
    return f"10.0.{k // 250}.{k % 250 + 4}"


def membership(n: int) -> Membership:
    return Membership(cluster_id="dlbench", generation=1, nodes=tuple(
        Node(rank=k, role="master" if k == 0 else "worker", instance_id=f"i-{k:017x}",
             address=address(k), alias=alias_for(k), gpus=8, instance_type="p4d.24xlarge")
        for k in range(n)))


def listing(n: int) -> str:
    return "\n".join(LINE.format(name=names.node_name(address(k)), addr=address(k),
                                 state="IDLE+DYNAMIC_NORM") for k in range(n)) + "\n"


def timed(fn: Callable[[], object], reps: int = REPS) -> float:
    """The median seconds of ``reps`` calls of ``fn``."""
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def ms(s: float) -> str:
    return f"{s * 1000:7.2f} ms"


def measure(tmp: Path, n: int) -> tuple:
    """One size's figures (seconds) and the node list's size (bytes)."""
    m = membership(n)
    text = listing(n)
    me = m.nodes[-1]
    efs = tmp / "efs"

    # each node: its Slurm files for the membership (first time, then unchanged)
    roots = iter(range(10**6))
    first = timed(lambda: node.write_config(SlurmPaths(tmp / f"n{next(roots)}", efs),
                                            "dlbench", m, 8))
    steady_root = SlurmPaths(tmp / "steady", efs)
    node.write_config(steady_root, "dlbench", m, 8)
    rewrite = timed(lambda: node.write_config(steady_root, "dlbench", m, 8))

    # the master's reconcile pass: steady, and with one node lost
    reconciler = node.Reconciler(SlurmPaths(tmp / "master", efs), ClusterPaths(efs))

    def one_pass(members: Membership) -> list[reconcile.Action]:
        reconciler.remember(members.nodes)
        listed = reconcile.parse_nodes(text)
        reconcile.health_drained(members, listed)
        return reconcile.plan(members, listed, known=reconciler.known)
    assert one_pass(m) == []
    parse = timed(lambda: reconcile.parse_nodes(text))
    steady = timed(lambda: one_pass(m))
    lost = Membership(cluster_id=m.cluster_id, generation=2, nodes=m.nodes[:-1])
    assert [a.kind for a in one_pass(lost)] == [reconcile.DOWN, reconcile.DELETE]
    after_loss = timed(lambda: one_pass(lost))

    # the prolog's lookup of its own node, at each job start
    paths = NodePaths(tmp / "prolog")
    paths.membership.parent.mkdir(parents=True, exist_ok=True)
    paths.membership.write_text(m.to_json())
    paths.env.parent.mkdir(parents=True, exist_ok=True)
    paths.env.write_text(f"DEEPLEARNING_NODE_ADDR={me.address}\n")
    assert prolog.own_node(paths.root) == me
    lookup = timed(lambda: prolog.own_node(paths.root))
    return first, rewrite, parse, steady, after_loss, lookup, len(text)


def test_slurm_product_code_at_1024_and_4096_nodes_simulation(tmp_path: Path) -> None:
    rows = [(n, *measure(tmp_path / str(n), n)) for n in SIZES]
    print(f"\n[bench] Slurm, {HOW}; median of {REPS} each")
    print("[bench] | nodes | a node's Slurm files, first / unchanged | master's pass: parse "
          "scontrol's list / whole pass steady / with one node lost | prolog's own-node "
          "lookup | scontrol's list |")
    for n, first, rewrite, parse, steady, after_loss, lookup, size in rows:
        print(f"[bench] | {n:>5} | {ms(first)} / {ms(rewrite)} | {ms(parse)} / {ms(steady)} / "
              f"{ms(after_loss)} | {ms(lookup)} | {size / 2**20:.1f} MiB |")

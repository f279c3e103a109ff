"""Benchmark, SIMULATION (one process, no AWS): formation and apply for 1,024 nodes.

Booting 1,024 real nodes does not fit a small machine; what grows with the cluster is the
master's formation (read every registration, choose the base, build and publish the
document) and each node's apply (load the document, render and write its files). Both run
here with the agent's own code, in one process, on one shared directory as EFS:

- 1,023 workers and the master are registered on EFS as their agents register
  (``state.write_registration``); the groups' answer (what ``DescribeAutoScalingGroups``
  and ``DescribeInstances`` return, not timed here) is the list of those instances;
- formation: the master's steps after discovery, as ``formation.form`` runs them through
  :class:`~bootstrap_scripts.agent.roster.Roster` and :mod:`~bootstrap_scripts.agent.policy`
  (read the registrations, choose the base workers, GPU counts, publish generation 1,
  apply it on the master's own root);
- apply: every worker's agent (a ``NodeAgent`` with its identity given, not running) applies
  the published generation with the worker loop's own function
  (``worker.apply_from_efs``: load, render, write, re-register), one node after another.

On a cluster the applies run in parallel, one per node, after each node's watch tick; so the
figure printed as "simulated latency" is formation + one watch interval (the longest wait
for the tick) + the slowest single apply. The sum of all applies is printed as well.
Nothing here asserts a time. Run with ``make bench``.
"""

from __future__ import annotations

import statistics
import threading
import time

import pytest

from bootstrap_scripts.agent import discovery as disco
from bootstrap_scripts.agent import policy
from bootstrap_scripts.agent.identity import NodeIdentity
from bootstrap_scripts.agent.node_agent import NodeAgent
from bootstrap_scripts.agent.roster import Roster
from bootstrap_scripts.agent.settings import AgentConfig
from bootstrap_scripts.agent.worker import apply_from_efs
from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.records import Registration
from tests.conftest import REGION

pytestmark = pytest.mark.bench

NODES = 1024
HOW = ("SIMULATION: one process, agent code in-process, no AWS calls, no interpreters "
       "starting; one shared directory as EFS")


def _agent(tmp, role: str, iid: str, address: str) -> NodeAgent:
    config = AgentConfig(role=role, cluster_id="dlc", stack_name="s", region=REGION,
                         master_queue_url="https://sqs.invalid/q", mount_point=str(tmp / "efs"),
                         root=str(tmp / "nodes" / iid), no_mount=True)
    agent = NodeAgent(config, identity=NodeIdentity(iid, "p4d.24xlarge", address, REGION),
                      stop_event=threading.Event())
    agent.gpus = 8
    return agent


def _address(k: int) -> str:
    return f"10.0.{128 + k // 250}.{k % 250 + 2}"


def test_formation_and_apply_1024_nodes_simulation(tmp_path):
    efs = tmp_path / "efs"
    master = _agent(tmp_path, "master", "i-master", "10.0.0.5")
    workers = [_agent(tmp_path, "worker", f"i-w{k:04d}", _address(k)) for k in range(NODES - 1)]
    for agent in [master, *workers]:
        (tmp_path / "nodes" / agent.identity.instance_id / "etc").mkdir(parents=True)
        (tmp_path / "nodes" / agent.identity.instance_id / "etc/hosts").write_text(
            "127.0.0.1 localhost\n")
        state.write_registration(efs, agent.registration())
    described = [disco.Instance(a.identity.instance_id, a.identity.address, "p4d.24xlarge")
                 for a in workers]

    # -- formation: the master's work after describing the groups --------------------------
    roster = Roster(master, master.aws)
    t0 = time.perf_counter()
    registrations: dict[str, Registration] = roster.read_registrations(
        w.instance_id for w in described)
    forming, _left_out = policy.forming_workers(described, draining=(), prepared=None)
    target = policy.base_target(NODES - 1, len(forming))
    base = policy.choose_base(forming, target)
    entries, fallback = policy.worker_entries(forming, registrations, base=base,
                                              fallback_gpus=master.gpus)
    m = roster.publish(entries, reason="initial")
    formation = time.perf_counter() - t0
    assert len(m.nodes) == NODES and not fallback and master.applied_generation == 1

    # -- apply: every worker, one after another ---------------------------------------------
    applies = []
    for agent in workers:
        t = time.perf_counter()
        apply_from_efs(agent, agent.cluster)
        applies.append(time.perf_counter() - t)
    assert all(a.applied_generation == 1 for a in workers)
    assert (tmp_path / "nodes" / workers[-1].identity.instance_id / "etc/hosts").read_text() \
        .count("deeplearning-worker") == NODES

    watch = workers[0].config.watch_interval
    latency = formation + watch + max(applies)
    print(f"\n[{HOW}]\n{NODES} nodes: formation (registrations read -> generation 1 "
          f"published and applied on the master) {formation:.2f} s; one node's apply median "
          f"{statistics.median(applies) * 1000:.0f} ms, slowest {max(applies) * 1000:.0f} ms; "
          f"all {NODES - 1} applies one after another {sum(applies):.1f} s\n"
          f"{NODES} nodes, simulated latency (formation + {watch:.2f} s watch interval + "
          f"slowest apply): {latency:.2f} s")

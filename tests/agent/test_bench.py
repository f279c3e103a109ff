"""Benchmark: seconds from the last agent start until every node has the membership.

Agents run as threads (separate roots, one shared "EFS" directory) against moto's server;
the ``asg-setup`` messages are already queued, as on a real boot where the groups finish
launching before the agents finish starting. Prints a table; asserts nothing about time.
Run with ``make bench`` (``pytest -m bench -s``).
"""

from __future__ import annotations

import threading
import time

import pytest

from bootstrap_scripts.agent.identity import NodeIdentity
from bootstrap_scripts.agent.node_agent import AgentConfig, NodeAgent
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import ClusterPaths
from emulator.resources import create_cluster
from tests.conftest import REGION
from tests.support.agents import wait_until

pytestmark = pytest.mark.bench

RESULTS: dict[int, dict[str, float]] = {}


def _agent(cluster, role, tmp, iid, ip) -> tuple[NodeAgent, threading.Thread]:
    cfg = AgentConfig(role=role, cluster_id=cluster.cluster_id, stack_name="s", region=REGION,
                      master_queue_url=cluster.master_queue_url, mount_point=str(tmp / "efs"),
                      root=str(tmp / "nodes" / iid), no_mount=True)
    agent = NodeAgent(cfg, identity=NodeIdentity(iid, "p3.2xlarge", ip, REGION),
                      stop_event=threading.Event())
    thread = threading.Thread(target=agent.run, daemon=True, name=iid)
    return agent, thread


@pytest.mark.parametrize("nodes", [4, 16, 64])
def test_time_to_membership(nodes, moto_reset, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    monkeypatch.setenv("PATH", f"{tmp_path}/nobin:/usr/bin:/bin")
    cluster = create_cluster(moto_reset, workers=nodes - 1)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    (mid, mip), = cluster.instances("master")
    workers = cluster.instances("worker")
    agents = {mid: _agent(cluster, "master", tmp_path, mid, mip)}
    agents.update({iid: _agent(cluster, "worker", tmp_path, iid, ip) for iid, ip in workers})
    try:
        for _a, thread in agents.values():
            thread.start()
        last_start = time.monotonic()
        wait_until(lambda: all(a.applied_generation >= 1 for a, _ in agents.values()), 120,
                   interval=0.005, what=f"{nodes} nodes to apply generation 1")
        formed = time.monotonic() - last_start

        # Replacement: one worker dies, the group launches another, the Lambda reports it.
        victim = workers[0][0]
        dead, dead_thread = agents.pop(victim)
        dead.stop.set()
        dead_thread.join(timeout=30)
        cluster.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=victim, ShouldDecrementDesiredCapacity=False)
        (new_id, new_ip), = [(i, a) for i, a in cluster.instances("worker")
                             if i not in agents and i != victim]
        agents[new_id] = _agent(cluster, "worker", tmp_path, new_id, new_ip)
        agents[new_id][1].start()
        wait_until(lambda: store.exists(ClusterPaths(tmp_path / "efs").registration(new_id)), 30,
                   interval=0.005, what="the new node to register")
        sent = time.monotonic()
        cluster.send(cluster.change_message("worker", "launch", new_id))
        wait_until(lambda: all(a.applied_generation >= 2 for a, _ in agents.values()), 120,
                   interval=0.005, what=f"{nodes} nodes to apply generation 2")
        replaced = time.monotonic() - sent
    finally:
        for agent, _thread in agents.values():
            agent.stop.set()
        for _a, thread in agents.values():
            thread.join(timeout=30)
    RESULTS[nodes] = {"formed": formed, "replaced": replaced}
    print(f"\n{nodes:>3} nodes: last agent start -> all have generation 1: {formed:6.2f} s;"
          f" membership-change message -> all have generation 2: {replaced:6.2f} s")
    if len(RESULTS) == 3:
        print("\n| nodes | last start -> generation 1 everywhere | replacement message -> "
              "generation 2 everywhere |\n|---:|---:|---:|")
        for n, r in sorted(RESULTS.items()):
            print(f"| {n} | {r['formed']:.2f} s | {r['replaced']:.2f} s |")

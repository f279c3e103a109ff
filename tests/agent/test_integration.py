"""One master and three workers as emulated nodes (``emulator.nodes``) against moto's server.

Each node has its own fake IMDSv2 endpoint bound to its moto-assigned loopback address, its
own root directory and its own GPU count, and runs the installer with its launch template's
arguments, then its agent and executor; they share one directory as "EFS". The Lambda's
``asg-setup`` and ``membership-change`` messages are built by its own code and queued by
the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import Membership, MembershipError
from bootstrap_scripts.protocol.node_files import HOSTS_BEGIN, parse_env_file
from bootstrap_scripts.protocol.paths import (
    ENV_FILE,
    HOROVOD_HOSTS_FILE,
    HOSTS_FILE,
    MEMBERSHIP_FILE,
    MPI_HOSTFILE,
    PROFILE_FILE,
    WORKERS_FILE,
    ClusterPaths,
)
from bootstrap_scripts.protocol.records import Registration
from emulator.nodes import Node as EmulatedNode
from emulator.resources import create_cluster
from emulator.wait_handle import WaitHandle
from tests.support.agents import wait_until

pytestmark = pytest.mark.slow

#: Keys whose values legitimately differ per node (the rest of the env must be identical).
PER_NODE_KEYS = {"DEEPLEARNING_NODE_RANK", "DEEPLEARNING_NODE_ADDR",
                 "DEEPLEARNING_WORKER_GPU_COUNT"}
ROOT_PATH_KEYS = {"DEEPLEARNING_WORKERS_PATH", "DEEPLEARNING_HOSTFILE",
                  "DEEPLEARNING_MEMBERSHIP_PATH"}
SHARED_FILES = [WORKERS_FILE, MPI_HOSTFILE, HOROVOD_HOSTS_FILE, MEMBERSHIP_FILE]


class Node:
    """An emulated node and the files its agent wrote."""

    def __init__(self, node: EmulatedNode) -> None:
        self.node = node
        self.instance_id, self.address, self.gpus = node.instance_id, node.address, node.gpus
        self.root = node.root

    def generation(self) -> int:
        try:
            return Membership.load(self.root / MEMBERSHIP_FILE).generation
        except (OSError, MembershipError):
            return 0

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def env_file(self) -> dict[str, str]:
        return parse_env_file(self.read(ENV_FILE))


def shared_env(node: Node) -> dict[str, str]:
    """The node's env file with per-node values dropped and its root prefix removed."""
    env = node.env_file()
    out = {k: v for k, v in env.items() if k not in PER_NODE_KEYS}
    for key in ROOT_PATH_KEYS:
        out[key] = "/" + str(Path(env[key]).relative_to(node.root))
    return out


def hosts_block(node: Node) -> str:
    text = node.read(HOSTS_FILE)
    return text[text.index(HOSTS_BEGIN):]


def assert_consistent(nodes: list[Node], generation: int) -> Membership:
    first = nodes[0]
    for node in nodes:
        assert node.generation() == generation, f"{node.instance_id} at {node.generation()}"
        for rel in SHARED_FILES:
            assert node.read(rel) == first.read(rel), f"{rel} differs on {node.instance_id}"
        assert shared_env(node) == shared_env(first), node.instance_id
        assert node.read(PROFILE_FILE).count("export ") == len(node.env_file())
        assert hosts_block(node) == hosts_block(first)
        assert node.read(HOSTS_FILE).startswith("127.0.0.1 localhost\n")
    m = Membership.load(first.root / MEMBERSHIP_FILE)
    for node in nodes:
        env = node.env_file()
        me = m.node_by_instance(node.instance_id)
        assert me is not None
        assert env["DEEPLEARNING_NODE_ADDR"] == node.address
        assert env["DEEPLEARNING_NODE_RANK"] == str(me.rank)
        assert env["DEEPLEARNING_WORKER_GPU_COUNT"] == str(node.gpus)
        assert env["DEEPLEARNING_MASTER_ADDR"] == m.master_addr
        assert env["DEEPLEARNING_WORKERS_COUNT"] == str(len(nodes))
        assert f"{node.address} slots={max(1, node.gpus)}\n" in node.read(MPI_HOSTFILE)
    return m


def shared_generation(efs: Path) -> int:
    try:
        return Membership.load(ClusterPaths(efs).membership).generation
    except (OSError, MembershipError):
        return 0


def test_master_and_three_workers_form_and_survive_a_replacement(moto_reset, tmp_path,
                                                                  boot_node):
    cluster = create_cluster(moto_reset, workers=3)
    efs = tmp_path / "efs"
    recorder = WaitHandle()
    nodes: dict[str, Node] = {}

    def boot(role: str, instance, gpus: int) -> None:
        node = boot_node(cluster, role, instance, gpus=gpus, wait_handle=recorder.url)
        nodes[instance.instance_id] = Node(node)

    try:
        ((master_id, _master_ip),) = cluster.instances("master")
        workers = cluster.instances("worker")

        # The groups are up before the agents finish booting: messages wait in the queue.
        cluster.send(cluster.setup_message("worker"))
        cluster.send(cluster.setup_message("master"))
        cluster.send("this is not JSON")  # malformed: logged, dead-lettered, ignored
        cluster.send({"event": "scale-the-moon", "role": "worker"})

        boot("master", cluster.node_instances("master")[0], gpus=2)
        for n, instance in enumerate(cluster.node_instances("worker")):
            boot("worker", instance, gpus=n + 1)

        signals = recorder.wait_for(1, timeout=90)
        assert signals, nodes[master_id].node.log_path("dl-agent").read_text()
        assert signals[0]["Status"] == "SUCCESS", signals[0]
        assert signals[0]["UniqueId"] == master_id
        assert json.loads(signals[0]["Data"])["nodes"] == 4
        assert recorder.headers[0].get("Content-Type", "") == ""

        live = list(nodes.values())
        wait_until(lambda: all(n.generation() == 1 for n in live), 60,
                   what="every node to apply generation 1")
        m1 = assert_consistent(live, 1)
        assert m1.master.instance_id == master_id
        worker_ips = [n.address for n in m1.nodes[1:]]
        assert worker_ips == sorted(worker_ips, key=lambda a: tuple(map(int, a.split("."))))
        wait_until(lambda: cluster.queue_depth() == 0, 30, what="the queue to drain")

        # -- replacement: the instance dies, the group launches another one ------------------
        victim_id = workers[0][0]
        nodes.pop(victim_id).node.stop()
        cluster.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=victim_id, ShouldDecrementDesiredCapacity=False)
        (new,) = [i for i in cluster.node_instances("worker") if i.instance_id not in nodes]
        new_id, new_ip = new.instance_id, new.address
        cluster.send(cluster.change_message("worker", "terminate", victim_id))
        cluster.send(cluster.change_message("worker", "launch", new_id))
        boot("worker", new, gpus=2)

        # The victim leaves at once; the newcomer joins once its agent registered (protocol
        # §7), so that is generation 2 or 3 depending on which the master saw first.
        live = list(nodes.values())

        def joined() -> int:
            current = shared_generation(efs)
            ok = current >= 2 and all(n.generation() == current for n in live)
            return current if ok and new_ip in nodes[new_id].read(WORKERS_FILE) else 0

        final = wait_until(joined, 60, what="every live node to apply the newcomer's generation")
        m2 = assert_consistent(live, final)
        assert new_ip in [n.address for n in m2.nodes]
        assert workers[0][1] not in [n.address for n in m2.nodes] or workers[0][1] == new_ip
        assert m2.node_by_instance(new_id).base  # replaces a base worker: promoted, protected
        assert len(recorder.signals) == 1  # the wait condition is signalled once

        cluster_paths = ClusterPaths(efs)
        log = cluster_paths.membership_log.read_text().splitlines()
        assert [line.split()[:2] for line in log][:4] == [["1", "ADDED"]] * 4
        assert any(line.split()[1:3] == ["ADDED", new_ip] and int(line.split()[0]) >= 2
                   for line in log)
        assert any(line.split()[1:3] == ["REMOVED", workers[0][1]] for line in log)
        assert cluster_paths.generation(final).read_text() == \
            cluster_paths.membership.read_text()
        for iid in nodes:
            reg = store.read_record(cluster_paths.registration(iid), Registration)
            assert reg.gpus == nodes[iid].gpus
            assert cluster_paths.agent_log(iid).exists()
        assert not cluster_paths.registration(victim_id).exists()
        master_log = cluster_paths.agent_log(master_id).read_text()
        assert master_log.count("event=refused-message ") == 2  # each received once
        assert master_log.count("event=dead-lettered") == 2
    finally:
        recorder.stop()

"""One master and three workers as separate processes against moto's server.

Each node has its own fake IMDSv2 endpoint bound to its moto-assigned loopback address, its
own root directory and its own GPU count; they share one directory as "EFS". The Lambda is
played by the test: it sends the ``asg-setup`` and ``membership-change`` messages.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap_scripts import membership as ms
from emulator.imds import MetadataServer
from tests.agent.fakecloud import (
    AgentProcesses,
    SignalRecorder,
    agent_argv,
    create_cluster,
    fake_nvidia_smi,
    wait_until,
)
from tests.conftest import REGION

pytestmark = pytest.mark.slow

#: Keys whose values legitimately differ per node (the rest of the env must be identical).
PER_NODE_KEYS = {"DEEPLEARNING_NODE_RANK", "DEEPLEARNING_NODE_ADDR",
                 "DEEPLEARNING_WORKER_GPU_COUNT"}
ROOT_PATH_KEYS = {"DEEPLEARNING_WORKERS_PATH", "DEEPLEARNING_HOSTFILE",
                  "DEEPLEARNING_MEMBERSHIP_PATH"}
SHARED_FILES = [ms.WORKERS_FILE, ms.MPI_HOSTFILE, ms.HOROVOD_HOSTS_FILE, ms.MEMBERSHIP_FILE]


class Node:
    def __init__(self, tmp: Path, instance_id: str, address: str, gpus: int) -> None:
        self.instance_id, self.address, self.gpus = instance_id, address, gpus
        self.root = tmp / "nodes" / instance_id
        self.root.mkdir(parents=True)
        (self.root / "etc").mkdir()
        (self.root / "etc/hosts").write_text("127.0.0.1 localhost\n")
        self.bin = fake_nvidia_smi(tmp / "bin" / instance_id, gpus)
        self.imds = MetadataServer()
        self.imds_url = self.imds.start(address, 0, {
            "instance_id": instance_id, "address": address, "instance_type": "p3.2xlarge",
            "region": REGION})

    def env(self, endpoint: str) -> dict[str, str]:
        import os

        return {"AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.imds_url,
                "PATH": f"{self.bin}:{os.environ['PATH']}"}

    def generation(self) -> int:
        try:
            return ms.Membership.load(self.root / ms.MEMBERSHIP_FILE).generation
        except (OSError, ms.MembershipError):
            return 0

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def env_file(self) -> dict[str, str]:
        return ms.parse_env_file(self.read(ms.ENV_FILE))


def shared_env(node: Node) -> dict[str, str]:
    """The node's env file with per-node values dropped and its root prefix removed."""
    env = node.env_file()
    out = {k: v for k, v in env.items() if k not in PER_NODE_KEYS}
    for key in ROOT_PATH_KEYS:
        out[key] = "/" + str(Path(env[key]).relative_to(node.root))
    return out


def hosts_block(node: Node) -> str:
    text = node.read(ms.HOSTS_FILE)
    return text[text.index(ms.HOSTS_BEGIN):]


def assert_consistent(nodes: list[Node], generation: int) -> ms.Membership:
    first = nodes[0]
    for node in nodes:
        assert node.generation() == generation, f"{node.instance_id} at {node.generation()}"
        for rel in SHARED_FILES:
            assert node.read(rel) == first.read(rel), f"{rel} differs on {node.instance_id}"
        assert shared_env(node) == shared_env(first), node.instance_id
        assert node.read(ms.PROFILE_FILE).count("export ") == len(node.env_file())
        assert hosts_block(node) == hosts_block(first)
        assert node.read(ms.HOSTS_FILE).startswith("127.0.0.1 localhost\n")
    m = ms.Membership.load(first.root / ms.MEMBERSHIP_FILE)
    for node in nodes:
        env = node.env_file()
        me = m.node_by_instance(node.instance_id)
        assert me is not None
        assert env["DEEPLEARNING_NODE_ADDR"] == node.address
        assert env["DEEPLEARNING_NODE_RANK"] == str(me.rank)
        assert env["DEEPLEARNING_WORKER_GPU_COUNT"] == str(node.gpus)
        assert env["DEEPLEARNING_MASTER_ADDR"] == m.master_addr
        assert env["DEEPLEARNING_WORKERS_COUNT"] == str(len(nodes))
        assert f"{node.address} slots={max(1, node.gpus)}\n" in node.read(ms.MPI_HOSTFILE)
    return m


def shared_generation(efs: Path) -> int:
    try:
        return ms.Membership.load(efs / ms.EFS_MEMBERSHIP).generation
    except (OSError, ms.MembershipError):
        return 0


def test_master_and_three_workers_form_and_survive_a_replacement(moto_reset, tmp_path):
    cluster = create_cluster(moto_reset, workers=3)
    efs = tmp_path / "efs"
    efs.mkdir()
    (tmp_path / "logs").mkdir()
    recorder = SignalRecorder()
    procs = AgentProcesses(tmp_path / "logs")
    nodes: dict[str, Node] = {}
    try:
        (master_id, master_ip), = cluster.instances("master")
        workers = cluster.instances("worker")
        nodes[master_id] = Node(tmp_path, master_id, master_ip, gpus=2)
        for n, (iid, ip) in enumerate(workers):
            nodes[iid] = Node(tmp_path, iid, ip, gpus=n + 1)

        # The groups are up before the agents finish booting: messages wait in the queue.
        cluster.send(cluster.setup_message("worker"))
        cluster.send(cluster.setup_message("master"))
        cluster.send("this is not JSON")  # malformed: logged, deleted, ignored
        cluster.send({"event": "scale-the-moon", "role": "worker"})

        for iid, node in nodes.items():
            role = "master" if iid == master_id else "worker"
            procs.start(iid, agent_argv(cluster, role, node.root, efs, recorder.url),
                        node.env(moto_reset))

        signals = recorder.wait_for(1, timeout=90)
        assert signals, procs.output(master_id)
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
        procs.stop(victim_id)
        nodes.pop(victim_id).imds.stop()
        cluster.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=victim_id, ShouldDecrementDesiredCapacity=False)
        (new_id, new_ip), = [(i, a) for i, a in cluster.instances("worker")
                             if i not in nodes]
        nodes[new_id] = Node(tmp_path, new_id, new_ip, gpus=2)
        cluster.send(cluster.change_message("worker", "terminate", victim_id))
        cluster.send(cluster.change_message("worker", "launch", new_id))
        procs.start(new_id, agent_argv(cluster, "worker", nodes[new_id].root, efs,
                                       recorder.url), nodes[new_id].env(moto_reset))

        # The victim leaves at once; the newcomer joins once its agent registered (protocol
        # §7), so that is generation 2 or 3 depending on which the master saw first.
        live = list(nodes.values())

        def joined() -> int:
            current = shared_generation(efs)
            ok = current >= 2 and all(n.generation() == current for n in live)
            return current if ok and new_ip in nodes[new_id].read(ms.WORKERS_FILE) else 0

        final = wait_until(joined, 60, what="every live node to apply the newcomer's generation")
        m2 = assert_consistent(live, final)
        assert new_ip in [n.address for n in m2.nodes]
        assert workers[0][1] not in [n.address for n in m2.nodes] or workers[0][1] == new_ip
        assert m2.node_by_instance(new_id).base  # replaces a base worker: promoted, protected
        assert len(recorder.signals) == 1  # the wait condition is signalled once

        log = (efs / ms.EFS_MEMBERSHIP_LOG).read_text().splitlines()
        assert [line.split()[:2] for line in log][:4] == [["1", "ADDED"]] * 4
        assert any(line.split()[1:3] == ["ADDED", new_ip] and int(line.split()[0]) >= 2
                   for line in log)
        assert any(line.split()[1:3] == ["REMOVED", workers[0][1]] for line in log)
        assert (efs / ms.EFS_GENERATIONS_DIR / f"{final}.json").read_text() == \
            (efs / ms.EFS_MEMBERSHIP).read_text()
        for iid in nodes:
            reg = json.loads((efs / ms.EFS_NODES_DIR / f"{iid}.json").read_text())
            assert reg["gpus"] == nodes[iid].gpus
            assert (efs / ms.EFS_LOGS_DIR / f"{iid}.log").exists()
        assert not (efs / ms.EFS_NODES_DIR / f"{victim_id}.json").exists()
        master_log = (efs / ms.EFS_LOGS_DIR / f"{master_id}.log").read_text()
        assert "event=skip-message" in master_log
        assert master_log.count("event=skip-message") == 2
    finally:
        procs.stop_all()
        for node in nodes.values():
            node.imds.stop()
        recorder.stop()

"""Auto Scaling replaces lost nodes and the cluster heals (``emulator.autoscaling`` + the
master's takeover), against moto's server with real emulated nodes and the real Lambda.

One cluster (a master and two workers) lives through three faults in turn:

1. a worker is marked Unhealthy (as the job controller does): Auto Scaling terminates it
   through its drain hook, launches a replacement whose node boots from the launch
   template, and the membership is back at full size in a newer generation;
2. a worker's machine dies (every process killed): nobody calls SetInstanceHealth; EC2's
   status check marks it Unhealthy and it is replaced the same way;
3. the master's machine dies: it is replaced, the new master takes the cluster over from
   EFS (the generation numbers continue, no second wait-condition signal), and the
   workers keep their files untouched until that new generation arrives.
"""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.protocol.membership import Membership, MembershipError
from bootstrap_scripts.protocol.paths import MEMBERSHIP_FILE, WORKERS_FILE, ClusterPaths
from emulator import notifications as nt
from emulator.autoscaling import AutoScaling
from emulator.deploy import CLUSTER_TAG_KEY, REGION, ROLE_TAG_KEY, aws_env
from emulator.resources import create_cluster
from emulator.wait_handle import WaitHandle

pytestmark = pytest.mark.slow

#: Generous bounds for a busy 2-core machine; a healthy run needs a fraction.
HEAL_TIMEOUT = 120.0


def generation(node) -> Membership | None:
    try:
        return Membership.load(node.root / MEMBERSHIP_FILE)
    except (OSError, MembershipError):
        return None


def healed(nodes: list, after: int, size: int) -> Membership | None:
    """The membership every running node applied, once it lists exactly them (``size``
    nodes) at a generation newer than ``after``."""
    live = [n for n in nodes if n.status == "running" and n.processes_alive()]
    docs = [generation(n) for n in live]
    if len(live) != size or not all(docs) or len({d.generation for d in docs}) != 1:
        return None
    m = docs[0]
    if m.generation <= after or sorted(x.address for x in m.nodes) != \
            sorted(n.address for n in live):
        return None
    return m


def test_unhealthy_and_lost_nodes_are_replaced_and_the_master_taken_over(
        emulator_cloud, moto_reset, tmp_path, boot_node, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    cluster = create_cluster(moto_reset, workers=2)
    recorder = WaitHandle()
    nodes: list = []

    def boot(instance, role: str):
        node = boot_node(cluster, role, instance, wait_handle=recorder.url)
        nodes.append(node)
        return node

    invoker = nt.LambdaInvoker("capacity-adjuster", {
        "MASTER_QUEUE_URL": cluster.master_queue_url, "CLUSTER_ID": cluster.cluster_id,
        "CLUSTER_TAG_KEY": CLUSTER_TAG_KEY, "ROLE_TAG_KEY": ROLE_TAG_KEY},
        aws_env(moto_reset), tmp_path / "lambda.log")
    session = boto3.session.Session(region_name=REGION)
    said: list[str] = []
    cloud = AutoScaling(session, {"master": cluster.master_asg, "worker": cluster.worker_asg},
                        nodes=lambda: list(nodes), boot=boot,
                        topic=nt.TopicSubscription(emulator_cloud.control, cluster.topic_arn,
                                                   invoker),
                        say=said.append, status_check_seconds=2.0)
    asg = cluster.client("autoscaling")
    try:
        cluster.send(cluster.setup_message("worker"))
        cluster.send(cluster.setup_message("master"))
        boot(cluster.node_instances("master")[0], "master")
        for instance in cluster.node_instances("worker"):
            boot(instance, "worker")
        m1 = cloud.run_until(lambda: healed(nodes, 0, 3), HEAL_TIMEOUT, "generation 1")
        assert m1.generation == 1 and len(recorder.signals) == 1

        # 1. a worker marked Unhealthy (the job controller's call) --------------------------
        sick = nodes[1]
        asg.set_instance_health(InstanceId=sick.instance_id, HealthStatus="Unhealthy")
        m2 = cloud.run_until(lambda: sick.status == "removed" and healed(nodes, 1, 3),
                             HEAL_TIMEOUT, "the unhealthy worker replaced")
        assert sick.instance_id not in [n.instance_id for n in m2.nodes]
        # the state lists the instance as EC2 does: terminated (its machine: removed)
        assert sick.to_state()["ec2_state"] == "terminated"
        assert nodes[0].to_state()["ec2_state"] == "running"
        (replacement,) = cloud.events_of("node-booted")
        assert replacement.role == "worker"
        assert replacement.instance_id in [n.instance_id for n in m2.nodes]
        assert [e.instance_id for e in cloud.events_of("unhealthy-terminated")] == \
            [sick.instance_id]
        assert not cloud.events_of("status-check-failed")  # it was marked, not dead
        assert any("drain-request" in d["outcomes"] for d in cloud.deliveries)

        # 2. a worker's machine dies: EC2's status check reports it -------------------------
        lost = nodes[2]
        lost.kill([])
        m3 = cloud.run_until(lambda: healed(nodes, m2.generation, 3), HEAL_TIMEOUT,
                             "the dead worker replaced")
        assert [e.instance_id for e in cloud.events_of("status-check-failed")] == \
            [lost.instance_id]
        assert lost.instance_id in [e.instance_id for e in cloud.events_of(
            "unhealthy-terminated")]
        assert lost.instance_id not in [n.instance_id for n in m3.nodes]
        # a killed machine stays "killed" in the state, whatever EC2 says of its instance
        assert lost.to_state()["status"] == "killed"
        assert len(cloud.events_of("node-booted")) == 2

        # 3. the master's machine dies: replaced, and the new master takes over -------------
        master = nodes[0]
        workers = [n for n in nodes if n.status == "running" and n.role == "worker"]
        before = {n.instance_id: {rel: (n.root / rel).read_bytes()
                                  for rel in (MEMBERSHIP_FILE, WORKERS_FILE)}
                  for n in workers}
        master.kill([])
        untouched: list[bool] = []

        def taken_over() -> Membership | None:
            for n in workers:  # until the new generation: the last one's files, as they were
                if generation(n) and generation(n).generation == m3.generation:
                    untouched.append(all((n.root / rel).read_bytes() == data
                                         for rel, data in before[n.instance_id].items()))
            return healed(nodes, m3.generation, 3)

        m4 = cloud.run_until(taken_over, HEAL_TIMEOUT, "the master replaced and taken over")
        assert untouched and all(untouched)
        new_master = next(n for n in nodes if n.role == "master" and n.status == "running")
        assert new_master.instance_id != master.instance_id
        assert m4.master.instance_id == new_master.instance_id
        assert m4.generation == m3.generation + 1  # the numbers continue
        assert m4.reason == "took-over"
        assert sorted(n.instance_id for n in m4.nodes[1:]) == \
            sorted(n.instance_id for n in workers)
        assert master.instance_id in [e.instance_id for e in cloud.events_of(
            "status-check-failed")]
        log = ClusterPaths(tmp_path / "efs").agent_log(new_master.instance_id).read_text()
        assert "event=take-over" in log and "event=took-over" in log
        assert len(recorder.signals) == 1  # the stack is complete: no second signal
        # the new master protects itself from scale-in, as the first one did
        group = cluster.group("master")
        (entry,) = [i for i in group["Instances"] if i["InstanceId"] == new_master.instance_id]
        assert entry["ProtectedFromScaleIn"]
    finally:
        recorder.stop()
        Path(tmp_path / "said.log").write_text("\n".join(said))

"""A warm pool end to end with real processes (``make bench``; not in ``make test``): a cluster
(master + 2 workers as real emulated nodes, the real Lambda) whose worker group has the
stack's launch hook and a warm pool of 1. The pool instance boots for real (installer, agent,
executor; its metadata says ``Warmed:Stopped``): its agent says it is ready on the
warm-ready queue, the master completes the hook for the instance SQS names as the sender, the
agent never registers, and EC2 stops it. A worker marked Unhealthy is replaced from the pool:
the stopped node starts again (no installer), its agent reads ``InService``, says it is ready
again, the master completes the hook, and it joins; the membership is back at full size with
it. Prints the replacement time (real processes; the start delay is 0, so this is the agent's
part, not EC2's)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.protocol.membership import Membership, MembershipError
from bootstrap_scripts.protocol.paths import MEMBERSHIP_FILE, ClusterPaths
from emulator import notifications as nt
from emulator.autoscaling import AutoScaling
from emulator.deploy import CLUSTER_TAG_KEY, REGION, ROLE_TAG_KEY, aws_env
from emulator.nodes import Node, stop_nodes
from emulator.resources import create_cluster
from emulator.wait_handle import WaitHandle

pytestmark = pytest.mark.bench

TIMEOUT = 120.0
HOOK = "warm-launch"
EC2_TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}


def generation(node) -> Membership | None:
    try:
        return Membership.load(node.root / MEMBERSHIP_FILE)
    except (OSError, MembershipError):
        return None


def full(nodes: list, after: int) -> Membership | None:
    """The membership of every running node, once it lists exactly them (3) after ``after``."""
    live = [n for n in nodes if n.status == "running" and n.processes_alive()]
    docs = [generation(n) for n in live]
    if len(live) != 3 or not all(docs) or len({d.generation for d in docs}) != 1:
        return None
    m = docs[0]
    ok = m.generation > after and sorted(x.address for x in m.nodes) == \
        sorted(n.address for n in live)
    return m if ok else None


def test_a_replacement_from_the_warm_pool_joins_without_a_boot(
        emulator_cloud, moto_reset, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    cluster = create_cluster(moto_reset, workers=2)
    recorder = WaitHandle()
    nodes: list[Node] = []

    # The stack's warm-ready queue and the workers' instance role: a worker's ready message
    # is believed for the instance its role session names (SQS's SenderId), nothing else.
    iam = cluster.client("iam")
    worker_role = iam.create_role(RoleName=f"{cluster.cluster_id}-worker",
                                  AssumeRolePolicyDocument=json.dumps(EC2_TRUST))["Role"]
    profile = iam.create_instance_profile(
        InstanceProfileName=f"{cluster.cluster_id}-worker")["InstanceProfile"]
    iam.add_role_to_instance_profile(InstanceProfileName=profile["InstanceProfileName"],
                                     RoleName=worker_role["RoleName"])
    ready_queue = cluster.client("sqs").create_queue(
        QueueName=f"{cluster.cluster_id}-warm-ready")["QueueUrl"]

    def boot(instance, role: str) -> Node:
        node = Node(instance, role, tmp_path / "nodes" / instance.instance_id, tmp_path / "efs",
                    tmp_path / "logs")
        nodes.append(node)
        args = cluster.install_args(role)
        # the stack's user data with a warm pool
        args = [*args, "--launch-hook", HOOK, "--warm-ready-queue-url", ready_queue]
        if role == "worker":
            args += ["--warm-poll-interval", "0.5"]
            node.role_arn, node.instance_profile_arn = worker_role["Arn"], profile["Arn"]
        else:
            args += ["--worker-role-id", worker_role["RoleId"]]
        node.boot(args, aws_env(cluster.endpoint), recorder.url)
        return node

    invoker = nt.LambdaInvoker("capacity-adjuster", {
        "MASTER_QUEUE_URL": cluster.master_queue_url, "CLUSTER_ID": cluster.cluster_id,
        "CLUSTER_TAG_KEY": CLUSTER_TAG_KEY, "ROLE_TAG_KEY": ROLE_TAG_KEY},
        aws_env(moto_reset), tmp_path / "lambda.log")
    said: list[str] = []
    cloud = AutoScaling(boto3.session.Session(region_name=REGION),
                        {"master": cluster.master_asg, "worker": cluster.worker_asg},
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
        m1 = cloud.run_until(lambda: full(nodes, 0), TIMEOUT, "generation 1")
        # the stack's launch hook and warm pool, added once the cluster formed
        asg.put_lifecycle_hook(LifecycleHookName=HOOK, AutoScalingGroupName=cluster.worker_asg,
                               LifecycleTransition="autoscaling:EC2_INSTANCE_LAUNCHING",
                               HeartbeatTimeout=300, DefaultResult="ABANDON")
        asg.put_warm_pool(AutoScalingGroupName=cluster.worker_asg, MinSize=1,
                          MaxGroupPreparedCapacity=1, PoolState="Stopped")

        def pool_ready():
            pool = asg.describe_warm_pool(AutoScalingGroupName=cluster.worker_asg)["Instances"]
            stopped = [n for n in nodes if n.status == "stopped"]
            return pool if pool and pool[0]["LifecycleState"] == "Warmed:Stopped" and \
                [n.instance_id for n in stopped] == [pool[0]["InstanceId"]] else None

        (warm,) = cloud.run_until(pool_ready, TIMEOUT, "the pool instance prepared, stopped")
        efs = ClusterPaths(tmp_path / "efs")
        warm_log = efs.agent_log(warm["InstanceId"]).read_text()
        assert "event=warm-pool-prepared" in warm_log and "launch_hook=sent" in warm_log
        master_log = efs.agent_log(cluster.node_instances("master")[0].instance_id).read_text()
        assert f"event=warm-ready instance={warm['InstanceId']} outcome=completed" in master_log
        assert not (efs.efs / "cluster" / "nodes" / f"{warm['InstanceId']}.json").exists()

        sick = next(n for n in nodes if n.role == "worker" and n.status == "running")
        asg.set_instance_health(InstanceId=sick.instance_id, HealthStatus="Unhealthy")
        t0 = time.monotonic()
        m2 = cloud.run_until(lambda: full(nodes, m1.generation), TIMEOUT,
                             "the replacement from the pool in the membership")
        seconds = time.monotonic() - t0
        assert warm["InstanceId"] in [x.instance_id for x in m2.nodes]
        assert sick.instance_id not in [x.instance_id for x in m2.nodes]
        assert [e.instance_id for e in cloud.events_of("node-started")] == [warm["InstanceId"]]
        log = efs.agent_log(warm["InstanceId"]).read_text()
        assert "event=launch-hook target=InService result=sent" in log
        master_log = efs.agent_log(cluster.node_instances("master")[0].instance_id).read_text()
        assert master_log.count(f"event=warm-ready instance={warm['InstanceId']} "
                                "outcome=completed") == 2
        states = {i["InstanceId"]: i["LifecycleState"] for i in cluster.group("worker")[
            "Instances"]}
        assert states[warm["InstanceId"]] == "InService"
        with capsys.disabled():
            print(f"\nwarm pool, REAL processes (start delay 0): Unhealthy -> the pool "
                  f"instance started, its agent joined, every node at the new generation: "
                  f"{seconds:.2f} s")
    finally:
        recorder.stop()
        Path(tmp_path / "said.log").write_text("\n".join(said))
        survivors = stop_nodes(nodes)
        assert not survivors, f"processes left behind: {sorted(survivors)}"

"""Elastic membership on the master agent (protocol.md §7), as threads against moto's server.

A worker leaves as on AWS: TerminateInstanceInAutoScalingGroup (what ``dl-scale --remove``
calls) holds it in ``Terminating:Wait`` and publishes the ``drain`` hook's notification to
the cluster's topic (the emulator's moto, ``emulator.lifecycle_hooks``); the test plays the
Lambda by sending the ``drain-request`` its builder makes from that notification's token,
and the agent's CompleteLifecycleAction goes to moto, which then terminates the instance.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.agent.identity import NodeIdentity
from bootstrap_scripts.protocol import state as shared
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import WORKERS_FILE, ClusterPaths
from bootstrap_scripts.protocol.records import DrainDone, PrepResult, Registration
from emulator import moto_publishing
from emulator.resources import ClusterResources, create_cluster
from emulator.wait_handle import WaitHandle
from tests.conftest import REGION
from tests.support.agents import AgentThread, config, master_identity, wait_until

LOG_LINE = re.compile(r"^(\d+) (ADDED|REMOVED) (\d+\.\d+\.\d+\.\d+) (\S+)$")


def leave(cluster: ClusterResources, iid: str) -> str:
    """Take ``iid`` out of the worker group as ``dl-scale --remove`` does; the token of the
    lifecycle action Auto Scaling published to the hook's topic."""
    cluster.client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=iid, ShouldDecrementDesiredCapacity=True)
    assert lifecycle_state(cluster, iid) == "Terminating:Wait"
    (msg,) = [m for m in (json.loads(p["message"]) for p in moto_publishing.published()
                          if p["topic_arn"] == cluster.topic_arn)
              if m.get("EC2InstanceId") == iid and "LifecycleActionToken" in m]
    return msg["LifecycleActionToken"]


def lifecycle_state(cluster: ClusterResources, iid: str) -> str | None:
    """The instance's state in the worker group; None once it left the group."""
    states = {i["InstanceId"]: i["LifecycleState"] for i in cluster.group("worker")["Instances"]}
    return states.get(iid)


def terminated(cluster: ClusterResources, iid: str) -> bool:
    """Auto Scaling let the instance go (its action completed) and EC2 terminated it."""
    res = cluster.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"]
    return lifecycle_state(cluster, iid) is None and \
        res[0]["Instances"][0]["State"]["Name"] == "terminated"


def register(efs: Path, cluster: ClusterResources, iid: str, address: str, gpus: int = 1) -> None:
    shared.write_registration(efs, Registration(instance_id=iid, address=address, role="worker",
                                                gpus=gpus, cluster_id=cluster.cluster_id))


def protected(cluster: ClusterResources) -> dict[str, bool]:
    out = {}
    for name in (cluster.master_asg, cluster.worker_asg):
        group = cluster.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
        out.update({i["InstanceId"]: i["ProtectedFromScaleIn"] for i in group["Instances"]})
    return out


def log_lines(efs: Path) -> list[tuple[str, str, str]]:
    lines = ClusterPaths(efs).membership_log.read_text().splitlines()
    parsed = [LOG_LINE.match(line) for line in lines]
    assert all(parsed), lines  # exactly "SEQ ADDED|REMOVED ADDRESS TIMESTAMP"
    return [(m[1], m[2], m[3]) for m in parsed if m]


def form(cluster: ClusterResources, recorder: WaitHandle, threads: list, tmp_path: Path,
         **kw) -> tuple[AgentThread, Path]:
    efs = tmp_path / "efs"
    for iid, ip in cluster.instances("worker"):
        register(efs, cluster, iid, ip)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url, **kw),
                    master_identity(cluster))
    threads.append(t)
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "SUCCESS", sig
    return t, efs


def test_base_protected_elastic_worker_drained_then_completed(env, tmp_path):
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=3)
    master, efs = form(cluster, recorder, threads, tmp_path, base_workers=2)
    m1 = shared.read_current(efs)
    workers = m1.nodes[1:]
    assert [n.base for n in workers] == [True, True, False]  # first two in membership order
    elastic = workers[2]
    flags = protected(cluster)
    assert flags[m1.master.instance_id] is True
    assert [flags[n.instance_id] for n in workers] == [True, True, False]

    token = leave(cluster, elastic.instance_id)
    cluster.send(cluster.drain_message(elastic.instance_id, token))
    wait_until(lambda: shared.read_current(efs).generation == 2, 20, what="generation 2")
    m2 = shared.read_current(efs)
    assert m2.node_by_instance(elastic.instance_id) is None
    assert m2.reason == "membership-change"
    record = shared.read_drain(efs, elastic.instance_id)
    assert record.address == elastic.address and record.deadline > record.requested_at
    assert not record.completed  # waits for the executor
    assert lifecycle_state(cluster, elastic.instance_id) == "Terminating:Wait"
    # The master appends the log line and applies the generation locally just after it
    # publishes membership.json: wait for both, bounded.
    wait_until(lambda: ("2", "REMOVED", elastic.address) in log_lines(efs), 10,
               what="the REMOVED line")
    root = tmp_path / "nodes" / "m"
    wait_until(lambda: elastic.address not in (root / WORKERS_FILE).read_text(), 10,
               what="the master's workers file without the node")

    store.write_record(ClusterPaths(efs).drain_done(elastic.instance_id),  # the executor
                       DrainDone(instance_id=elastic.instance_id, address=elastic.address,
                                 done_at=record.requested_at + 1))
    # CompleteLifecycleAction CONTINUE with the hook, group and token: Auto Scaling ends
    # the wait and the instance terminates.
    wait_until(lambda: terminated(cluster, elastic.instance_id), 20,
               what="CompleteLifecycleAction to terminate the instance")
    done = wait_until(lambda: (r := shared.read_drain(efs, elastic.instance_id))
                      .completed and r, 10, what="the drain record to complete")
    assert (done.reason, done.outcome, done.result) == ("done", "completed", "CONTINUE")

    # a duplicate of the same lifecycle action changes nothing
    cluster.send(cluster.drain_message(elastic.instance_id, token))
    cluster.send(cluster.setup_message("worker"))  # and a re-read finds nothing new
    wait_until(lambda: cluster.queue_depth() == 0, 20, what="the queue to drain")
    master.agent.stop.wait(1.5)
    assert shared.read_current(efs).generation == 2
    assert shared.read_drain(efs, elastic.instance_id) == done  # not completed again


def test_drain_deadline_completes_without_the_executor(env, tmp_path):
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=2)
    _master, efs = form(cluster, recorder, threads, tmp_path, drain_timeout=1.0)
    victim = shared.read_current(efs).nodes[2]
    cluster.send(cluster.drain_message(victim.instance_id, leave(cluster, victim.instance_id)))
    wait_until(lambda: terminated(cluster, victim.instance_id), 20,
               what="CompleteLifecycleAction at the deadline")
    record = wait_until(lambda: (r := shared.read_drain(efs, victim.instance_id))
                        .completed and r, 10, what="the completed record")
    assert (record.reason, record.outcome) == ("deadline", "completed")
    assert shared.read_current(efs).node_by_instance(victim.instance_id) is None


def test_drain_of_a_non_member_completes_at_once(env, tmp_path):
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    _master, efs = form(cluster, recorder, threads, tmp_path)
    cluster.send(cluster.drain_message("i-0123456789abcdef0", str(uuid.uuid4())))
    record = wait_until(lambda: (r := shared.read_drain(efs, "i-0123456789abcdef0"))
                        and r.completed and r, 20, what="the completed record")
    assert record.reason == "not-a-member"
    # Auto Scaling holds no such action: its answer is final, not retried.
    assert record.outcome.startswith("no-active-action: ") and record.attempts == 0
    assert "No active Lifecycle Action found" in record.outcome
    assert shared.read_current(efs).generation == 1


def test_scale_out_joins_only_registered_and_prepared_nodes(env, tmp_path):
    """Workers run --data-prep; a failing one never joins, the others do, as elastic."""
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    efs = tmp_path / "efs"
    prep = 'test "$DL_INSTANCE_ID" != "$FAIL_ON" || { echo "no data for me" >&2; exit 3; }'
    ((w1, ip1),) = cluster.instances("worker")

    def worker(iid: str, ip: str) -> AgentThread:
        t = AgentThread(config(cluster, "worker", tmp_path, iid, data_prep=prep),
                        NodeIdentity(iid, "p3.2xlarge", ip, REGION))
        threads.append(t)
        return t

    worker(w1, ip1)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    threads.append(AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                                      data_prep=prep, base_workers=1),
                               master_identity(cluster)))
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "SUCCESS", sig
    assert shared.prep_status(efs, w1) == "ok"
    m1 = shared.read_current(efs)
    assert [n.instance_id for n in m1.nodes[1:]] == [w1] and m1.nodes[1].base

    cluster.client("autoscaling").set_desired_capacity(
        AutoScalingGroupName=cluster.worker_asg, DesiredCapacity=3)
    new = [(i, a) for i, a in cluster.instances("worker") if i != w1]
    (good, good_ip), (bad, bad_ip) = new
    import os

    os.environ["FAIL_ON"] = bad  # the worker threads' prep command reads it
    try:
        cluster.send(cluster.setup_message("worker"))  # the Lambda: group at desired
        worker(good, good_ip)
        worker(bad, bad_ip)
        wait_until(lambda: shared.read_current(efs).generation == 2, 30, what="generation 2")
        wait_until(lambda: shared.prep_status(efs, bad) == "failed", 30, what="the failure")
    finally:
        del os.environ["FAIL_ON"]
    m2 = shared.read_current(efs)
    assert [n.instance_id for n in m2.nodes[1:]] == [w1, good]
    assert m2.node_by_instance(good).base is False
    failed = store.read_record(ClusterPaths(efs).prepared(bad, "failed"), PrepResult)
    assert failed.exit_code == 3 and "no data for me" in failed.output_tail
    wait_until(lambda: ("2", "ADDED", good_ip) in log_lines(efs), 10, what="the ADDED line")
    assert bad_ip not in [a for _s, _k, a in log_lines(efs)]
    good_root = tmp_path / "nodes" / good
    wait_until(lambda: good_root.joinpath(WORKERS_FILE).exists(), 10, what="workers file")
    assert good_root.joinpath(WORKERS_FILE).read_text() == \
        "".join(f"{n.address}\n" for n in m2.nodes)
    assert not (tmp_path / "nodes" / bad / WORKERS_FILE).exists()
    # The refusal is logged when the master next sees the .failed marker, which can come
    # after generation 2 (with the good node) was published: wait for it, bounded.
    master_log = ClusterPaths(efs).agent_log(m1.master.instance_id)
    wait_until(lambda: "event=join-refused instance_id=" + bad in master_log.read_text(), 15,
               what="the master refusing the unprepared node")


def test_node_started_by_hand_from_the_launch_template_joins(env, tmp_path):
    """No Auto Scaling message announces it: the master finds its registration."""
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    _master, efs = form(cluster, recorder, threads, tmp_path)
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION)
    template = {"LaunchTemplateName": cluster.launch_templates["worker"]}
    inst = ec2.run_instances(LaunchTemplate=template, MinCount=1, MaxCount=1,
                             SubnetId=cluster.subnet_id)["Instances"][0]
    register(efs, cluster, inst["InstanceId"], inst["PrivateIpAddress"], gpus=2)
    wait_until(lambda: shared.read_current(efs).generation == 2, 30, what="generation 2")
    node = shared.read_current(efs).node_by_instance(inst["InstanceId"])
    assert node is not None and node.gpus == 2 and node.base is False
    assert protected(cluster).get(inst["InstanceId"]) is None  # not a group member


@pytest.mark.bench
def test_bench_drain_and_join_latency(env, tmp_path):
    """Figures for docs/elastic.md: drain-request sent -> generation without the node, and
    a newcomer's registration -> generation with it (master thread, moto server)."""
    import time

    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=2)
    _master, efs = form(cluster, recorder, threads, tmp_path)
    drains, joins = [], []
    for round_ in range(5):
        gen = shared.read_current(efs).generation
        victim = shared.read_current(efs).nodes[-1]
        started = time.monotonic()
        cluster.send(cluster.drain_message(victim.instance_id, str(uuid.uuid4())))
        wait_until(lambda g=gen: shared.read_current(efs).generation == g + 1, 30,
                   interval=0.005, what="the drain generation")
        drains.append(time.monotonic() - started)
        cluster.client("autoscaling").set_desired_capacity(
            AutoScalingGroupName=cluster.worker_asg, DesiredCapacity=2 + round_ + 1)
        members = {n.instance_id for n in shared.read_current(efs).nodes}
        iid, ip = next((i, a) for i, a in cluster.instances("worker")
                       if i not in members and shared.read_drain(efs, i) is None)
        started = time.monotonic()
        register(efs, cluster, iid, ip)
        wait_until(lambda g=gen: shared.read_current(efs).generation == g + 2, 30,
                   interval=0.005, what="the join generation")
        joins.append(time.monotonic() - started)
    print(f"\ndrain-request -> generation without the node: median "
          f"{sorted(drains)[2]:.2f}s max {max(drains):.2f}s")
    print(f"registration (no Auto Scaling message) -> generation with the node: median "
          f"{sorted(joins)[2]:.2f}s max {max(joins):.2f}s")

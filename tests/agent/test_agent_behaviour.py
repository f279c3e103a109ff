"""Agent decisions, run as threads against moto's server: failures, timeouts, generations."""

from __future__ import annotations

import time

import pytest

from bootstrap_scripts.agent.identity import NodeIdentity
from bootstrap_scripts.agent.node_agent import EXIT_FAILED
from bootstrap_scripts.protocol import state as shared
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.node_signature import NO_KEY_HINT
from bootstrap_scripts.protocol.paths import WORKERS_FILE, ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import LaunchAttempt, LaunchFailures, Registration
from emulator.cloud import fail_launches
from emulator.resources import create_cluster
from tests.conftest import REGION
from tests.support.agents import AgentThread, config, master_identity, wait_until


def test_failure_message_fails_the_wait_condition_at_once(env, tmp_path):
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=2)
    fail_launches(cluster.worker_asg, 2)  # the group is below its minimum (1)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker", status="failure",
                                       reason="0 of 2 launched, min 1"))
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url),
                    master_identity(cluster))
    threads.append(t)
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "FAILURE"
    assert "0 of 2 launched, min 1" in sig["Reason"] and cluster.worker_asg in sig["Reason"]
    t.thread.join(timeout=30)
    assert t.exit_code == EXIT_FAILED


def test_failure_of_a_group_that_recovered_does_not_fail_the_setup(env, tmp_path):
    """SQS does not keep order and Auto Scaling keeps retrying: a failure read after the
    group reached its minimum again is outdated; its success message forms the cluster."""
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker", status="failure",
                                       reason="0 of 1 launched, min 1"))
    cluster.send(cluster.setup_message("worker"))
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                           registration_wait=0.5), master_identity(cluster))
    threads.append(t)
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "SUCCESS", sig


@pytest.fixture()
def timed_out_setup(env, tmp_path):
    """``begin(workers)``: a cluster whose master's own group reported success and whose
    first worker registered (as its agent writes it), with ``fail()`` to run the master
    agent with a 2 s setup timeout and return the FAILURE reason it signals (after the
    agent exited failed). What each test adds goes between the two."""
    endpoint, recorder, threads = env

    def begin(workers: int):
        cluster = create_cluster(endpoint, workers=workers)
        cluster.send(cluster.setup_message("master"))
        (w1, ip1), *_ = cluster.instances("worker")
        shared.write_registration(tmp_path / "efs", Registration(
            instance_id=w1, address=ip1, gpus=1, role="worker"))

        def fail() -> str:
            t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                                   setup_timeout=2), master_identity(cluster))
            threads.append(t)
            (sig,) = recorder.wait_for(1, timeout=30)
            assert sig["Status"] == "FAILURE", sig
            t.thread.join(timeout=30)
            assert t.exit_code == EXIT_FAILED
            return sig["Reason"]

        return cluster, fail

    return begin


def test_setup_timeout_fails_naming_the_missing_group(timed_out_setup, tmp_path):
    """The reason names the group, its instances that never registered (with their type)
    and the newest launch failure the capacity adjuster reported for it."""
    cluster, fail = timed_out_setup(workers=2)
    (w1, _ip1), (w2, _ip2) = cluster.instances("worker")
    store.write_record(ClusterPaths(tmp_path / "efs").launch_failures, LaunchFailures(
        attempts=(LaunchAttempt(role="worker", asg=cluster.worker_asg, zone="us-east-1a",
                                instance_types=("p5.48xlarge",),
                                cause="We currently do not have sufficient p5.48xlarge "
                                      "capacity"),)))
    reason = fail()
    assert "no asg-setup success for worker group(s) within 2s" in reason
    assert f"worker group {cluster.worker_asg}: 2 of 2 instances running, 1 registered" \
        in reason, reason
    assert f"not registered (still booting or failed to boot): {w2} (" in reason
    assert w1 not in reason
    assert ("last launch failure: zone us-east-1a, p5.48xlarge: We currently do not have "
            "sufficient p5.48xlarge capacity") in reason


def test_setup_timeout_names_a_worker_that_booted_without_a_node_key(timed_out_setup,
                                                                     tmp_path):
    """A worker on user data older than node keys registers, but to a master that learns
    node keys its registration is not its own: the reason says that it booted and what to
    do (replace it), not that it is still booting."""
    cluster, fail = timed_out_setup(workers=1)
    (w1, _ip1), = cluster.instances("worker")
    # this master learns node keys (its agent makes the book when it serves the queue)
    NodePaths(tmp_path / "nodes" / "m").node_keys_dir.mkdir(parents=True, mode=0o700)
    reason = fail()
    assert (f"1 of 1 instances running, 0 registered; booted, but no node key learnt from it "
            f"({NO_KEY_HINT}): {w1} (") in reason, reason
    assert "still booting" not in reason, reason


def test_unregistered_worker_gets_fallback_gpus_then_its_own(env, tmp_path):
    """Nobody registers within the wait: form anyway, then correct the GPU count later."""
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                           registration_wait=0.5), master_identity(cluster))
    threads.append(t)
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "SUCCESS"
    efs = tmp_path / "efs"
    m1 = shared.read_current(efs)
    assert m1.generation == 1 and [n.gpus for n in m1.nodes] == [0, 0]
    (wid, wip), = cluster.instances("worker")
    shared.write_registration(efs, Registration(instance_id=wid, address=wip, gpus=4,
                                                role="worker"))
    wait_until(lambda: (m := shared.read_current(efs)).generation == 2 and m, 30,
               what="a generation with the worker's real GPU count")
    m2 = shared.read_current(efs)
    assert m2.node_by_instance(wid).gpus == 4
    assert len(recorder.signals) == 1


def test_worker_applies_newer_generations_and_ignores_older(env, tmp_path):
    endpoint, _recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    efs = tmp_path / "efs"
    me = NodeIdentity("i-w", "p3.2xlarge", "127.20.128.9", REGION)

    def membership(gen: int, other: str) -> Membership:
        return build_membership(
            cluster_id=cluster.cluster_id, generation=gen,
            master={"instance_id": "i-m", "address": "127.20.0.4"},
            workers=[{"instance_id": "i-w", "address": me.address},
                     {"instance_id": "i-x", "address": other}], efs_mount=str(efs))

    t = AgentThread(config(cluster, "worker", tmp_path, "w"), me)
    threads.append(t)
    root = tmp_path / "nodes" / "w"
    shared.publish(efs, membership(3, "127.20.128.30"), None)
    wait_until(lambda: t.agent.applied_generation == 3, 10, what="generation 3")
    shared.publish(efs, membership(2, "127.20.128.20"), None)  # a stale writer
    wait_until(lambda: "reason=older" in ClusterPaths(efs).agent_log("i-w").read_text(), 10,
               what="the older generation to be seen and skipped")
    assert "127.20.128.30" in (root / WORKERS_FILE).read_text()
    shared.publish(efs, membership(4, "127.20.128.40"), None)
    wait_until(lambda: t.agent.applied_generation == 4, 10, what="generation 4")
    assert (root / WORKERS_FILE).read_text() == "127.20.0.4\n127.20.128.9\n127.20.128.40\n"
    reg = wait_until(lambda: (r := store.read_record(
        ClusterPaths(efs).registration("i-w"), Registration)).generation_applied == 4 and r,
        10, what="the heartbeat to report generation 4")
    assert reg.address == me.address and reg.role == "worker"


def test_restarted_master_resumes_without_a_second_signal(env, tmp_path):
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    ident = master_identity(cluster)
    first = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                               registration_wait=0.2), ident)
    recorder.wait_for(1, timeout=30)
    first.stop()
    second = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url), ident)
    threads.append(second)
    wait_until(lambda: second.agent.formed.is_set(), 10, what="the restarted master to resume")
    # A scale-out after the restart still produces a new generation.
    asg = cluster.client("autoscaling")
    asg.set_desired_capacity(AutoScalingGroupName=cluster.worker_asg, DesiredCapacity=2)
    new_id, new_ip = cluster.instances("worker")[-1]
    cluster.send(cluster.change_message("worker", "launch", new_id))
    efs = tmp_path / "efs"
    # A newcomer joins once registered (protocol.md §7): its agent does that at boot.
    shared.write_registration(efs, Registration(instance_id=new_id, address=new_ip, gpus=1,
                                                role="worker", cluster_id=cluster.cluster_id))
    wait_until(lambda: shared.read_current(efs).generation == 2, 30, what="generation 2")
    assert len(shared.read_current(efs).nodes) == 3
    assert len(recorder.signals) == 1


def test_messages_for_another_cluster_are_skipped(env, tmp_path):
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=1)
    other = {**cluster.setup_message("worker", status="failure"), "cluster_id": "someone-else"}
    cluster.send(other)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                           registration_wait=0.2), master_identity(cluster))
    threads.append(t)
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "SUCCESS"


def test_untagged_worker_group_forms_with_the_instances_the_lambda_listed(env, tmp_path):
    endpoint, recorder, threads = env
    cluster = create_cluster(endpoint, workers=2)
    setup = cluster.setup_message("worker")
    cluster.client("autoscaling").delete_tags(Tags=[
        {"ResourceId": cluster.worker_asg, "ResourceType": "auto-scaling-group",
         "Key": "dl-cluster:id"}])
    cluster.send(cluster.setup_message("master"))
    cluster.send(setup)
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                           registration_wait=0.2), master_identity(cluster))
    threads.append(t)
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "SUCCESS"
    m = shared.read_current(tmp_path / "efs")
    assert sorted(n.instance_id for n in m.nodes[1:]) == sorted(setup["instances"])
    log = ClusterPaths(tmp_path / "efs").agent_log(m.master.instance_id).read_text()
    assert "event=group-missing role=worker" in log


def test_a_listed_instance_the_group_lost_is_not_waited_for_a_whole_boot_budget(
        env, tmp_path, monkeypatch):
    """The registration wait is the node boot budget (minutes); an instance the Lambda
    listed that the group no longer has is not booting: formation waits for it only the
    describe-consistency window, then forms with the registered nodes."""
    from bootstrap_scripts.agent import formation

    endpoint, recorder, threads = env
    monkeypatch.setattr(formation, "ABSENT_WAIT_SECONDS", 0.5)
    cluster = create_cluster(endpoint, workers=2)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))  # lists both workers
    (gone,) = fail_launches(cluster.worker_asg, 1)
    ((wid, wip),) = [i for i in cluster.instances("worker") if i[0] != gone]
    shared.write_registration(tmp_path / "efs", Registration(
        instance_id=wid, address=wip, gpus=1, role="worker"))
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                           registration_wait=600), master_identity(cluster))
    threads.append(t)
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "SUCCESS", sig
    m = shared.read_current(tmp_path / "efs")
    assert gone not in {n.instance_id for n in m.nodes} and len(m.nodes) == 2


def test_formation_opens_a_registration_once_while_it_waits_for_the_others(
        env, tmp_path, monkeypatch):
    """While the forming master waits for the last registrations, the ones it has read are
    not opened again at every 0.1 s tick (at 64 nodes that was 0.1 CPU of the master's,
    at 1,024 about 1.5); the generation still carries each node's registered GPU count."""
    endpoint, recorder, threads = env
    efs = tmp_path / "efs"
    cluster = create_cluster(endpoint, workers=2)
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    (early, early_ip), (late, late_ip) = cluster.instances("worker")
    shared.write_registration(efs, Registration(instance_id=early, address=early_ip, gpus=2,
                                                role="worker"))
    real_read = shared.read_registration
    early_reads_while_waiting = []

    def counting_read(where, iid):
        if iid == early and not ClusterPaths(efs).registration(late).exists():
            early_reads_while_waiting.append(iid)
        return real_read(where, iid)

    monkeypatch.setattr(shared, "read_registration", counting_read)
    t = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url,
                           registration_wait=30), master_identity(cluster))
    threads.append(t)
    wait_until(lambda: early_reads_while_waiting, 30, interval=0.05,
               what="the forming master to read the first registration")
    time.sleep(0.5)  # five ticks of the formation loop
    shared.write_registration(efs, Registration(instance_id=late, address=late_ip, gpus=4,
                                                role="worker"))
    (sig,) = recorder.wait_for(1, timeout=30)
    assert sig["Status"] == "SUCCESS"
    m = shared.read_current(efs)
    assert m.generation == 1
    assert {n.instance_id: n.gpus for n in m.nodes[1:]} == {early: 2, late: 4}
    assert len(early_reads_while_waiting) <= 2, early_reads_while_waiting

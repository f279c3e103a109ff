"""dl-scale against moto's server: refusals name the values, allowed requests reach AWS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap_scripts.agent.node_files import apply_membership
from bootstrap_scripts.ops import scale
from bootstrap_scripts.protocol import membership as ms
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import DrainRecord, PrepResult, Registration
from emulator.resources import ClusterResources, create_cluster


@pytest.fixture()
def cloud(moto_reset, monkeypatch, tmp_path) -> tuple[ClusterResources, Path, ms.Membership]:
    """Master + 3 workers (2 base, 1 elastic) as the master agent would have published."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    cluster = create_cluster(moto_reset, workers=3, min_workers=0)
    asg = cluster.client("autoscaling")
    asg.update_auto_scaling_group(AutoScalingGroupName=cluster.worker_asg, MaxSize=5)
    efs = tmp_path / "efs"
    ((mid, mip),) = cluster.instances("master")
    workers = cluster.instances("worker")
    m = ms.build_membership(
        cluster_id=cluster.cluster_id, generation=4, efs_mount=str(efs),
        master={"instance_id": mid, "address": mip},
        workers=[{"instance_id": i, "address": a, "base": n < 2}
                 for n, (i, a) in enumerate(workers)])
    state.publish(efs, m, None)
    root = tmp_path / "node"
    apply_membership(root, m, instance_id=mid)
    base_ids = [n.instance_id for n in m.nodes[1:] if n.base]
    asg.set_instance_protection(InstanceIds=base_ids, AutoScalingGroupName=cluster.worker_asg,
                                ProtectedFromScaleIn=True)
    return cluster, root, m


def run(root: Path, *args: str) -> int:
    return scale.main(["--root", str(root), *args])


def desired(cluster: ClusterResources) -> int:
    return cluster.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[cluster.worker_asg])["AutoScalingGroups"][0]["DesiredCapacity"]


def test_workers_below_base_or_above_max_is_refused_naming_the_values(cloud, capsys):
    cluster, root, _m = cloud
    assert run(root, "--workers", "1") == scale.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "--workers 1 is below the 2 base worker(s)" in err and "protected" in err
    assert "dl-scale --status shows the base, minimum, maximum" in err
    assert run(root, "--workers", "6") == scale.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "--workers 6 is above the worker group's maximum 5" in err
    assert "dl-scale --status shows the base, minimum, maximum" in err
    assert desired(cluster) == 3


def test_workers_sets_desired_capacity(cloud, capsys):
    cluster, root, _m = cloud
    assert run(root, "--workers", "5") == 0
    assert "workers 3 -> 5" in capsys.readouterr().out
    assert desired(cluster) == 5
    assert run(root, "--workers", "2") == 0  # down to the base count: allowed
    assert desired(cluster) == 2


def test_remove_refuses_master_and_base_workers(cloud, capsys):
    cluster, root, m = cloud
    assert run(root, "--remove", m.master.address) == scale.EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"{m.master.address} ({m.master.instance_id}) is the master" in err
    assert "would stop every job" in err
    base = m.nodes[1]
    assert run(root, "--remove", base.instance_id) == scale.EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"{base.instance_id} is a base worker" in err and "protected from scale-in" in err
    assert run(root, "--remove", "127.20.99.99") == scale.EXIT_REFUSED
    assert "no node of cluster dlc-test has address 127.20.99.99" in capsys.readouterr().err
    assert desired(cluster) == 3 and len(cluster.instances("worker")) == 3


def test_remove_elastic_worker_terminates_it_through_the_group(cloud, capsys):
    cluster, root, m = cloud
    elastic = m.nodes[3]
    assert not elastic.base
    assert run(root, "--remove", elastic.address) == 0
    assert "drain hook" in capsys.readouterr().out
    assert desired(cluster) == 2  # decremented: no replacement is launched
    assert elastic.instance_id not in [i for i, _ in cluster.instances("worker")]


def test_status_lists_roles_kinds_and_joiners(cloud, capsys):
    _cluster, root, m = cloud
    efs = Path(m.efs_mount)
    joiner = "i-0aaaaaaaaaaaaaaa1"
    state.write_registration(efs, Registration(instance_id=joiner, role="worker",
                                               address="127.20.128.77", generation_applied=0))
    store.write_record(ClusterPaths(efs).prepared(joiner, "failed"), PrepResult(
        instance_id=joiner, address="127.20.128.77", command="prepare", started_at=0.0,
        finished_at=1.0, seconds=1.0, exit_code=1))
    state.write_drain(efs, DrainRecord(
        instance_id=m.nodes[3].instance_id, address=m.nodes[3].address, requested_at=0.0,
        deadline=0.0, asg="workers", role="worker", lifecycle_hook="drain",
        lifecycle_action_token="token"))
    assert run(root, "--status") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cluster dlc-test  generation 4  workers desired 3 (min 0, max 5, "
                             "base 2)")
    rows = [line.split() for line in out[2:]]
    assert [r[:2] for r in rows[:4]] == [["master", "base"], ["worker", "base"],
                                         ["worker", "base"], ["worker", "elastic"]]
    assert rows[3][-1] == "draining"
    assert any("127.20.128.77" in line and "data-prep-failed" in line for line in out)


def test_no_membership_is_a_clear_refusal(moto_reset, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    assert run(tmp_path, "--status") == scale.EXIT_REFUSED
    assert "membership.json does not exist" in capsys.readouterr().err
    assert scale.main(["--workers"]) == scale.EXIT_USAGE


def health_of(cluster: ClusterResources, instance_id: str) -> str:
    found = cluster.client("autoscaling").describe_auto_scaling_instances(
        InstanceIds=[instance_id])["AutoScalingInstances"]
    return found[0]["HealthStatus"] if found else "gone"


def test_replace_marks_a_worker_unhealthy_base_ones_included(cloud, capsys):
    """A straggler (or a suspect GPU) that passes every check: Auto Scaling replaces it
    (health replacement keeps the group's size and is not stopped by scale-in protection)."""
    cluster, root, m = cloud
    base = m.nodes[1]
    assert base.base
    assert run(root, "--replace", base.address) == 0
    out = capsys.readouterr().out
    assert f"replacing {base.address} ({base.instance_id}): marked Unhealthy" in out
    assert health_of(cluster, base.instance_id).upper() in ("UNHEALTHY", "GONE")
    assert desired(cluster) == 3  # a replacement, not a scale-in


def test_replace_refuses_the_master_and_strangers(cloud, capsys):
    cluster, root, m = cloud
    assert run(root, "--replace", m.master.instance_id) == scale.EXIT_REFUSED
    assert "is the master" in capsys.readouterr().err
    assert health_of(cluster, m.master.instance_id).upper() == "HEALTHY"
    assert run(root, "--replace", "127.20.99.99") == scale.EXIT_REFUSED
    assert "no node of cluster dlc-test has address 127.20.99.99" in capsys.readouterr().err


def test_a_forged_membership_on_efs_does_not_name_the_node_to_replace(cloud, capsys):
    """Root on a worker writes a newer membership on EFS that puts worker 2's address on
    worker 1's instance: dl-scale names nodes from the node's own applied copy only, so
    ``--replace <worker 2's address>`` marks worker 2, never the healthy worker 1."""
    cluster, root, m = cloud
    w1, w2 = m.nodes[1], m.nodes[2]
    doc = json.loads(m.to_json())
    doc["generation"] = m.generation + 1
    for node in doc["nodes"]:
        if node["instance_id"] in (w1.instance_id, w2.instance_id):
            node["address"] = w2.address if node["instance_id"] == w1.instance_id else w1.address
    store.atomic_write(ClusterPaths(Path(m.efs_mount)).membership, json.dumps(doc))
    assert run(root, "--replace", w2.address) == 0
    assert f"({w2.instance_id}): marked Unhealthy" in capsys.readouterr().out
    assert health_of(cluster, w1.instance_id).upper() == "HEALTHY"

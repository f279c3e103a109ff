"""dl-health against emulated nodes: real executors, registrations as the node agent writes them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat, Registration
from emulator.nodes import PYTHON, base_env
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def register(c, node, **overrides):
    """The agent's registration (docs/protocol.md §5), written as the agent does."""
    now = time.time()
    record = {"instance_id": node.instance_id, "address": node.address, "role": node.role,
              "gpus": node.gpus, "instance_type": "c5.xlarge", "agent_pid": 4242,
              "started_at": now - 60, "heartbeat": now, "generation_applied": 1,
              "efs_mount": str(c.efs), **overrides}
    state.write_registration(c.efs, Registration(**record))


def health(c, *args):
    return subprocess.run([PYTHON, "-m", "bootstrap_scripts.ops.health", "--root",
                           str(c.master_root), *args], cwd=REPO_ROOT, env=base_env(),
                          capture_output=True, text=True, timeout=60)


def test_healthy_cluster_reports_every_node_and_leaves_no_probe(emu):
    c = emu(3)
    c.start_executors()
    for node in c.membership.nodes:
        register(c, node)
    res = health(c)
    assert res.returncode == 0, res.stdout + res.stderr
    for node in c.membership.nodes:
        assert f"{node.rank}     {node.address}" in res.stdout
    assert res.stdout.rstrip().endswith("healthy")
    assert list(ClusterPaths(c.efs).health_dir.iterdir()) == []

    data = json.loads(health(c, "--json").stdout)
    assert data["healthy"] is True and len(data["nodes"]) == 3
    assert all(n["clock"]["ok"] and n["efs"]["ok"] for n in data["nodes"])
    # each executor measured its node's local disk (the node's own root here)
    assert all(n["disk"]["ok"] and n["disk"]["detail"].endswith(" MiB free")
               for n in data["nodes"]), data["nodes"]


def test_each_failing_check_names_the_node(emu):
    c = emu(3)
    c.start_executors()
    master, w1, w2 = c.membership.nodes
    register(c, master)
    register(c, w1, gpus=3, generation_applied=0)  # wrong GPU count, stale generation
    # w2: agent never registered, and its executor stops
    os.killpg(c.executors[w2.address].pid, signal.SIGTERM)
    c.executors[w2.address].wait(timeout=20)
    res = health(c)
    assert res.returncode == 1, res.stdout
    lines = {line.split(" FAILED")[0]: line
             for line in res.stdout.splitlines() if " FAILED:" in line}
    assert set(lines) == {f"node 1 ({w1.address})", f"node 2 ({w2.address})"}
    assert "gpus: 3 (expected 0)" in lines[f"node 1 ({w1.address})"]
    assert "generation: 0/1" in lines[f"node 1 ({w1.address})"]
    assert "reachable: executor stopped" in lines[f"node 2 ({w2.address})"]
    assert "agent: not registered" in lines[f"node 2 ({w2.address})"]
    assert "UNHEALTHY: 2 node(s) failing" in res.stdout


def test_skewed_clock_unwritable_efs_and_a_full_disk_are_reported(emu):
    c = emu(2)
    c.start_executors([c.addresses[0]])
    for node in c.membership.nodes:
        register(c, node)
    # The worker's "executor" heartbeats with a clock 30 s ahead and a failed EFS read-back.
    worker = c.membership.nodes[1]
    store.write_record(ClusterPaths(c.efs).executor_heartbeat(worker.address), ExecutorHeartbeat(
        address=worker.address, state="running", seq=1, heartbeat=time.time() + 30,
        efs_ok=False, efs_mounted=False, gpus=0, generation=1, disk_free_mib=100))
    res = health(c)
    assert res.returncode == 1, res.stdout
    failed = [line for line in res.stdout.splitlines() if " FAILED:" in line]
    assert len(failed) == 1 and worker.address in failed[0]
    assert "efs: not writable" in failed[0]
    assert "disk: 100 MiB free" in failed[0]  # under the default floor, 1024 MiB
    assert "clock: +30." in failed[0] or "clock: +29." in failed[0]


def test_missing_membership_is_a_clear_error(tmp_path):
    res = subprocess.run([PYTHON, "-m", "bootstrap_scripts.ops.health", "--root", str(tmp_path)],
                         cwd=REPO_ROOT, env=base_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert str(NodePaths(tmp_path).membership) in res.stderr


def test_failed_launches_are_listed_with_zone_type_and_cause(emu):
    """What the capacity adjuster reported as failed launches (``asg-setup`` attempts, kept
    on EFS by the master agent) is shown without making the formed cluster unhealthy."""
    from bootstrap_scripts.protocol import launches
    from bootstrap_scripts.protocol.messages import AsgSetup

    c = emu(2)
    c.start_executors()
    for node in c.membership.nodes:
        register(c, node)
    cause = ("We currently do not have sufficient p5.48xlarge capacity in the Availability "
             "Zone you requested (us-east-1a).")
    msg = AsgSetup(role="worker", asg="dl-workers", status="success", cluster_id="c",
                   desired=2, launched=2,
                   attempts=({"zone": "us-east-1a", "instance_types": ["p5.48xlarge"],
                              "cause": cause, "decision": "move"},))
    assert launches.record_attempts(ClusterPaths(c.efs), msg) == 1
    res = health(c)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "failed launches (1, " in res.stdout
    assert ("  worker dl-workers: zone us-east-1a, p5.48xlarge: We currently do not have "
            "sufficient p5.48xlarge capacity") in res.stdout
    assert "(moved to the next zone)" in res.stdout
    data = json.loads(health(c, "--json").stdout)
    assert data["healthy"] is True
    (failed,) = data["launch_failures"]
    assert (failed["zone"], failed["instance_types"], failed["decision"]) == (
        "us-east-1a", ["p5.48xlarge"], "move")

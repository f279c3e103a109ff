"""The health gate end to end: emulated nodes (real executors, stand-in GPUs), moto's EC2.

Every node is an executor-only emulated node of instance type g5.xlarge (1 GPU, as moto's
DescribeInstanceTypes says) with a stand-in nvidia-smi listing one GPU; the checks run as
real jobs through the executors and the all-reduce as a real torchrun job (gloo on CPU).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from bootstrap_scripts.jobs.engine.reachability import MOVE_WITHIN_SECONDS
from bootstrap_scripts.ops.gate import GateSettings, run_gate
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import InstanceTypeFacts
from emulator.gpus import give_gpus, inject_gpu_fault
from emulator.nodes import PYTHON, base_env
from tests.conftest import REGION, REPO_ROOT
from tests.support.cluster import CLUSTER_ID, LocalCluster, free_rdzv_port

pytestmark = pytest.mark.slow
ITYPE = "g5.xlarge"


def gpu_cluster(emu, n_nodes: int) -> tuple[LocalCluster, Membership]:
    """``n_nodes`` g5.xlarge nodes, one stand-in GPU each, executors running."""
    c = emu(n_nodes)
    for node in c.nodes:
        give_gpus(node.root, node.env, 1)
    master, *workers = c.nodes

    def entry(node):
        return {"instance_id": node.instance_id, "address": node.address, "gpus": 1,
                "instance_type": ITYPE}

    m = build_membership(cluster_id=CLUSTER_ID, generation=1, efs_mount=str(c.efs),
                         master=entry(master), workers=[entry(w) for w in workers])
    for node in c.nodes:
        node.apply(m)
    c.start_executors()
    return c, m


def settings(c: LocalCluster, **kw) -> GateSettings:
    return GateSettings(rdzv_port=int(free_rdzv_port(c)), allreduce_mib=4, allreduce_iters=3,
                        **kw)


@pytest.fixture()
def aws(moto_endpoint, monkeypatch) -> dict[str, str]:
    env = {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": REGION,
           "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_EC2_METADATA_DISABLED": "true"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def test_every_node_passes_and_dl_health_deep_prints_the_table(emu, aws):
    c, _m = gpu_cluster(emu, 3)
    res = subprocess.run([PYTHON, "-m", "bootstrap_scripts.ops.health", "--root",
                          str(c.master_root), "--deep", "--rdzv-port", free_rdzv_port(c),
                          "--allreduce-mib", "4", "--allreduce-iters", "3"],
                         cwd=REPO_ROOT, env=base_env(aws), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    header, *rows = [ln for ln in res.stdout.splitlines()
                     if ln.startswith(("RANK", "0 ", "1 ", "2 "))]
    assert header.split() == ["RANK", "ADDRESS", "TYPE", "EXECUTOR", "GPUS", "NVIDIA-SMI",
                              "DCGM", "EFA", "EFS", "DISK", "ALLREDUCE"]
    assert len(rows) == 3
    for row in rows:
        cells = row.split()
        # DCGM's level-1 diagnostic passes: the GPU DLAMIs ship DCGM, as the emulated GPU
        assert cells[2:13] == [ITYPE, "ok", "answers", "ok", "1", "ok", "answers", "ok",
                               "pass", "n/a", "ok"], row
        assert cells[14:18] == ["MB/s", "ok", cells[16], "MiB"] and int(cells[16]) >= 1024, row
        assert cells[18:] == ["free", "ok", cells[20], "GB/s"] and float(cells[20]) >= 0, row
    assert "healthy: 3 node(s) passed every check" in res.stdout
    # the instance type was asked once and is cached on EFS
    facts = store.read_record(ClusterPaths(c.efs).instance_type(ITYPE), InstanceTypeFacts)
    assert facts.gpus == 1 and facts.gpu_name == "A10G" and not facts.efa_supported
    # the gate's jobs are recognisable and finished
    names = sorted(d.name for d in c.job_dirs())
    assert [n.split("-2")[0] for n in names] == ["health-allreduce", "health-checks"]


def test_a_node_whose_nvidia_smi_fails_fails_that_check_only(emu, aws):
    c, m = gpu_cluster(emu, 3)
    bad = c.nodes[1]
    inject_gpu_fault(bad.root)
    report = run_gate(c.master_root, c.efs, m, settings=settings(c))
    assert not report.ok
    # a driver that does not answer fails DCGM's diagnostic on that node too
    assert [(f.address, f.instance_id, f.check, f.value) for f in report.failures] == [
        (bad.address, bad.instance_id, "nvidia-smi", "exit 9"),
        (bad.address, bad.instance_id, "dcgm", "exit 9")]
    assert "NVIDIA driver" in report.failures[0].detail
    cells = {n.node.address: n.cells for n in report.nodes}
    assert cells[bad.address]["allreduce"].status == "skip"
    for node in (c.nodes[0], c.nodes[2]):
        assert cells[node.address]["gpus"].value == "1"
        assert cells[node.address]["allreduce"].status == "ok"
        assert "2 rank(s)" in cells[node.address]["allreduce"].detail  # the two healthy ones
    data = json.loads(report.to_json())
    assert data["ok"] is False and data["failures"][0]["check"] == "nvidia-smi"


def test_a_node_whose_executor_is_gone_is_found_before_the_checks_are_sent(emu, aws):
    c, m = gpu_cluster(emu, 3)
    gone = c.nodes[2]
    os.kill(gone.executor.pid, signal.SIGKILL)  # its last heartbeat still looks fresh
    gone.executor.wait(timeout=10)
    # However fresh its timestamp (and however long executor_stale), a heartbeat that does
    # not move is not an executor: the gate finds out in seconds and sends it nothing.
    report = run_gate(c.master_root, c.efs, m,
                      settings=settings(c, budget_start=4, executor_stale=60))
    assert [(f.address, f.check, f.value) for f in report.failures] == [
        (gone.address, "executor",
         f"executor heartbeat not seen to change in {MOVE_WITHIN_SECONDS:.0f} s")]
    by = {n.node.address: n for n in report.nodes}
    assert all(by[n.address].ok for n in c.nodes[:2])
    assert by[gone.address].cells["allreduce"].status == "skip"


def test_a_node_with_fewer_gpus_than_its_type_fails_the_gpu_count(emu, aws):
    c, m = gpu_cluster(emu, 2)
    short = c.nodes[1]
    give_gpus(short.root, short.env, 0)  # the same script, rewritten: lists no GPU now
    report = run_gate(c.master_root, c.efs, m, settings=settings(c, allreduce=False))
    assert [(f.address, f.check, f.value) for f in report.failures] == [
        (short.address, "gpus", "0 (expected 1)")]
    assert "g5.xlarge (DescribeInstanceTypes)" in report.failures[0].detail


def test_a_node_whose_local_disk_is_nearly_full_fails_the_disk_check(emu, aws):
    """A real small filesystem (a 64 MiB tmpfs) as one node's local disk, under a 128 MiB
    floor: that node fails ``disk``, named with its free space; the others pass."""
    c, m = gpu_cluster(emu, 2)
    small = c.nodes[1]
    state = NodePaths(small.root).executor_state_dir
    state.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(state)], check=True)
    try:
        report = run_gate(c.master_root, c.efs, m,
                          settings=settings(c, allreduce=False, disk_floor_mib=128))
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)
    failures = [(f.address, f.check) for f in report.failures]
    assert failures == [(small.address, "disk")], report.to_json()
    assert report.failures[0].value.endswith(" MiB free")
    assert int(report.failures[0].value.split()[0]) <= 64
    assert "floor 128 MiB" in report.failures[0].detail
    assert report.nodes[0].cells["disk"].status == "ok"


def test_a_membership_without_instance_types_is_judged_on_the_registered_counts(emu):
    """Older membership documents, no metadata service (executor-only nodes): the GPU count
    is compared with what the agents registered, and the report says so; no EC2 call."""
    c = emu(2)
    c.start_executors()
    report = run_gate(c.master_root, c.efs, c.membership, settings=settings(c, allreduce=False))
    assert report.ok, report.to_json()
    for n in report.nodes:
        assert n.cells["gpus"].value == "0" and "instance type unknown" in n.cells["gpus"].detail
        assert n.cells["nvidia-smi"].status == "n/a" and n.cells["allreduce"].status == "n/a"
    assert not ClusterPaths(c.efs).instance_types_dir.exists()

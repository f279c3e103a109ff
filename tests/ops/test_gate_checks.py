"""The health gate's rules, one finding at a time (pure), and the instance-type cache
against moto's real server (DescribeInstanceTypes over HTTP)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.ops import gate_report as gr
from bootstrap_scripts.ops import instance_types as it
from bootstrap_scripts.ops import node_checks as nc
from bootstrap_scripts.ops.allreduce import alg_bandwidth, bus_bandwidth
from bootstrap_scripts.ops.gate import parse_log, sub_membership
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import InstanceTypeFacts
from tests.conftest import REGION
from tests.support.quotas import operator_quotas

GPU1 = gr.Expected("g5.xlarge", 1, "g5.xlarge (DescribeInstanceTypes)")
CPU = gr.Expected("c5.xlarge", 0, "c5.xlarge (DescribeInstanceTypes)")


def found(check, status="ok", value="", detail="", **extra):
    return nc.result(check, status, value, detail, **extra)


# -- node-side parsing ----------------------------------------------------------------------


def test_nvidia_smi_list_counts_gpus_not_mig_devices():
    text = ("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n"
            "  MIG 1g.5gb Device 0: (UUID: MIG-1)\n"
            "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2)\n")
    assert nc.parse_gpu_list(text) == 2


def test_dcgm_json_and_table_outputs_name_the_failed_test():
    ok = {"category": [{"tests": [{"name": "Deployment", "results": [{"status": "Pass"}]}]}]}
    bad = {"tests": [{"name": "PCIe", "results": [{"status": "Fail"}]},
                     {"name": "Memory", "results": [{"status": "Skip"}]}]}
    assert nc.parse_dcgm(json.dumps(ok)) == (True, "")
    assert nc.parse_dcgm(json.dumps(bad)) == (False, "PCIe")
    table = ("| Diagnostic       | Result |\n|------------------+--------|\n"
             "| Deployment       | Pass   |\n| Blacklist        | Fail   |\n")
    assert nc.parse_dcgm(table) == (False, "Blacklist")


def test_efa_devices_from_sysfs_and_fi_info(tmp_path):
    drivers = tmp_path / "drivers"
    (drivers / "efa").mkdir(parents=True)
    (drivers / "mlx5_core").mkdir()
    for dev, driver in (("rdmap16s27", "efa"), ("mlx5_0", "mlx5_core")):
        (tmp_path / "ib" / dev / "device").mkdir(parents=True)
        (tmp_path / "ib" / dev / "device" / "driver").symlink_to(drivers / driver)
    assert nc.efa_sysfs_devices(tmp_path / "ib") == ["rdmap16s27"]
    assert nc.efa_sysfs_devices(tmp_path / "missing") == []
    fi = ("provider: efa\n    fabric: efa\n    domain: rdmap16s27-rdm\n"
          "provider: efa\n    fabric: efa\n    domain: rdmap16s27-dgrm\n"
          "provider: efa\n    domain: rdmap32s27-rdm\n")
    assert nc.parse_fi_info(fi) == ["rdmap16s27", "rdmap32s27"]


def test_efs_check_measures_both_ways_and_leaves_no_probe(tmp_path):
    line = nc.check_efs(tmp_path, 2, "t")
    assert line["status"] == "ok" and line["mib"] == 2
    assert line["value"] == min(line["write_mbps"], line["read_mbps"])
    assert list(ClusterPaths(tmp_path).health_dir.iterdir()) == []
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    line = nc.check_efs(not_a_dir, 1, "t")  # its probe directory cannot be created (even as root)
    assert line["status"] == "error" and line["value"] == "not writable"


def test_a_tool_that_hangs_is_cut_at_its_budget(tmp_path, monkeypatch):
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!{sys.executable}\nimport time; time.sleep(30)\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    line = nc.check_nvidia_smi(0.5)
    assert (line["status"], line["value"]) == ("timeout", "timeout after 0.5 s")


def test_gate_reads_findings_between_other_output():
    log = ("some warning\n" + nc.MARKER + json.dumps(found("efs", value=12.5)) + "\n"
           "[rank0]: " + nc.MARKER + json.dumps(found("allreduce", value=1.5)) + "\n"
           + nc.MARKER + "{not json\nRuntimeError: boom\n")
    by_check, last = parse_log(log)
    assert set(by_check) == {"efs", "allreduce"} and last == "RuntimeError: boom"


# -- verdicts -------------------------------------------------------------------------------


def test_gpu_count_against_the_instance_type():
    assert gr.decide_gpus(found("nvidia-smi", value=1), GPU1, 1) == gr.Cell(
        "ok", "1", "expected from g5.xlarge (DescribeInstanceTypes)")
    cell = gr.decide_gpus(found("nvidia-smi", value=7), gr.Expected("p4d.24xlarge", 8, "p4d"), 8)
    assert (cell.status, cell.value) == ("fail", "7 (expected 8)")
    # no driver on a GPU type: 0 GPUs, a failure; on a CPU type: fine
    assert gr.decide_gpus(found("nvidia-smi", "absent", "n/a"), GPU1, 1).value == \
        "0 (expected 1)"
    assert gr.decide_gpus(found("nvidia-smi", "absent", "n/a"), CPU, 0).status == "ok"
    # a failing driver is nvidia-smi's failure, not a second one here
    assert gr.decide_gpus(found("nvidia-smi", "error", "exit 9"), GPU1, 1).status == "skip"
    # no instance type anywhere: the registered count is the reference, and it says so
    cell = gr.decide_gpus(found("nvidia-smi", value=2), gr.Expected(), 2)
    assert cell.status == "ok" and "instance type unknown" in cell.detail
    # EC2 could not describe the type: a failure naming why
    cell = gr.decide_gpus(found("nvidia-smi", value=1),
                          gr.Expected("x1.big", None, "", "DescribeInstanceTypes failed"), 1)
    assert (cell.status, cell.detail) == ("fail", "DescribeInstanceTypes failed")


def test_nvidia_smi_and_dcgm_matter_only_where_gpus_are_expected():
    broken = found("nvidia-smi", "error", "exit 9", "NVIDIA-SMI has failed")
    assert gr.decide_nvidia_smi(broken, GPU1) == gr.Cell("fail", "exit 9",
                                                          "NVIDIA-SMI has failed")
    assert gr.decide_nvidia_smi(broken, CPU).status == "n/a"
    # instance type unknown: the registered count decides whether a driver must answer
    assert gr.decide_nvidia_smi(found("nvidia-smi", "absent", "n/a"), gr.Expected(), 0).status \
        == "n/a"
    assert gr.decide_nvidia_smi(found("nvidia-smi", "absent", "n/a"), gr.Expected(), 4).status \
        == "fail"
    assert gr.decide_nvidia_smi(found("nvidia-smi", "timeout", "timeout after 10 s"),
                                GPU1).value == "timeout after 10 s"
    assert gr.decide_dcgm(found("dcgm", "absent", "n/a", "dcgmi not found"), GPU1).status == "n/a"
    assert gr.decide_dcgm(found("dcgm", "error", "fail", "failed: PCIe"), GPU1) == gr.Cell(
        "fail", "fail", "failed: PCIe")
    assert gr.decide_dcgm(found("dcgm", value="pass"), GPU1).status == "ok"
    assert gr.decide_dcgm(found("dcgm", "error", "fail"), CPU).status == "n/a"


def test_efa_only_where_an_efa_interface_is_attached():
    attached = gr.Expected("p4d.24xlarge", 8, "p4d", efa=1)
    assert gr.decide_efa(found("efa", value=0), CPU).status == "n/a"
    assert gr.decide_efa(found("efa", value=1), attached).status == "ok"
    assert gr.decide_efa(found("efa", value=0), attached).value == "0 (expected 1)"
    unknown = gr.Expected("p4d.24xlarge", 8, "p4d", "DescribeInstances failed", efa=None)
    assert gr.decide_efa(found("efa", value=1), unknown) == gr.Cell(
        "fail", "unknown", "DescribeInstances failed")


def test_floors_of_efs_and_allreduce():
    efs = found("efs", value=3.2, write_mbps=3.2, read_mbps=90.0, mib=8)
    assert gr.decide_efs(efs, 5).status == "fail"
    assert gr.decide_efs(efs, 0).value == "3.2 MB/s"
    assert gr.decide_efs(found("efs", "error", "not writable", "EROFS"), 0).status == "fail"
    ar = found("allreduce", value=0.25, detail="gloo, 2 rank(s)")
    assert gr.decide_allreduce(ar, 0).status == "ok"
    assert gr.decide_allreduce(ar, 10).status == "fail"


def test_local_disk_free_space_against_its_floor(tmp_path):
    disk = found("disk", value=700, detail="/var/lib/dl-executor", total_mib=8000)
    assert gr.decide_disk(disk, 1024) == gr.Cell(
        "fail", "700 MiB free", "700 of 8000 MiB free on /var/lib/dl-executor; floor 1024 MiB")
    assert gr.decide_disk(disk, 700).status == "ok"
    assert gr.decide_disk(found("disk", "error", "cannot stat", "ENOENT"), 0).status == "fail"
    assert gr.GateSettings().disk_floor_mib == 1024
    with pytest.raises(ValueError, match="disk"):
        gr.GateSettings(disk_floor_mib=-1)
    line = nc.check_disk(tmp_path)
    assert line["check"] == "disk" and line["status"] == "ok"
    assert 0 < line["value"] <= line["total_mib"] and line["detail"] == str(tmp_path)
    assert nc.check_disk(tmp_path / "absent")["status"] == "error"


def test_the_disk_measured_is_the_executors_state_on_the_jobs_node(tmp_path):
    """A share finds its node's root from the membership path the executor gives it (in
    the emulator every node has its own root); the nearest existing directory is measured."""
    root = tmp_path / "node-1"
    (root / "var/lib").mkdir(parents=True)
    env = {"DEEPLEARNING_MEMBERSHIP_PATH": str(root / "opt/deeplearning/membership.json")}
    assert nc.local_disk_path(env) == root / "var/lib"
    (root / "var/lib/dl-executor").mkdir()
    assert nc.local_disk_path(env) == root / "var/lib/dl-executor"
    assert NodePaths.of_membership_file(env["DEEPLEARNING_MEMBERSHIP_PATH"]).root == root
    with pytest.raises(ValueError):
        NodePaths.of_membership_file(root / "membership.json")
    assert nc.local_disk_path({}).is_relative_to("/")


def test_busbw_is_algbw_times_two_n_minus_one_over_n():
    assert bus_bandwidth(alg_bandwidth(8_000_000_000, 1.0), 8) == pytest.approx(14e9)
    assert bus_bandwidth(5.0, 2) == 5.0
    assert bus_bandwidth(5.0, 1) == 0.0
    with pytest.raises(ValueError):
        alg_bandwidth(1, 0)


def test_settings_are_checked_and_budgets_bound_each_check():
    s = gr.GateSettings()
    assert (s.budget_nvidia_smi, s.budget_dcgm, s.budget_efs, s.budget_allreduce) == \
        (10, 120, 20, 120)
    assert s.node_budget("dcgm") == 131  # it waits for nvidia-smi first
    with pytest.raises(ValueError, match="budget_efs"):
        gr.GateSettings(budget_efs=0)
    with pytest.raises(ValueError, match="floors"):
        gr.GateSettings(allreduce_floor_gbps=-1)
    assert gr.timeout(4).value == "timeout after 4 s"


def test_report_lists_failures_and_summarises_them():
    m = build_membership(cluster_id="c", generation=3,
                         master={"instance_id": "i-1", "address": "10.0.0.1"},
                         workers=[{"instance_id": "i-2", "address": "10.0.0.2"}])
    good = gr.NodeReport(m.nodes[0], {c: gr.Cell("ok", "x") for c in gr.CHECKS}, "g5.xlarge")
    bad = gr.NodeReport(m.nodes[1], {"executor": gr.timeout(20), "allreduce": gr.Cell(
        "skip", "-")}, "g5.xlarge")
    report = gr.GateReport([good, bad], duration_s=21.5)
    assert not report.ok and report.failed_addresses == ["10.0.0.2"]
    assert report.failures == [gr.NodeFailure("10.0.0.2", "i-2", "executor",
                                              "timeout after 20 s", "no answer within the "
                                              "budget")]
    assert gr.summary(report) == ("UNHEALTHY: 1 of 2 node(s) failing after 21.5 s: 10.0.0.2 "
                                  "(i-2): executor timeout after 20 s")
    table = gr.render_table(report).splitlines()
    assert table[0].split()[3:] == [c.upper() for c in gr.CHECKS]
    assert "FAIL timeout after 20 s" in table[2]
    assert json.loads(report.to_json())["failures"][0]["check"] == "executor"


def test_gate_jobs_run_on_a_renumbered_membership_master_first():
    m = build_membership(cluster_id="c", generation=4, master={"instance_id": "i-1",
                         "address": "10.0.0.1", "gpus": 8, "instance_type": "p4d.24xlarge"},
                         workers=[{"instance_id": f"i-{k}", "address": f"10.0.0.{k}",
                                   "gpus": 8} for k in (2, 3, 4)])
    sub = sub_membership(m, [m.nodes[3], m.nodes[1]], Path("/efs"))
    assert [(n.rank, n.role, n.address) for n in sub.nodes] == [
        (0, "master", "10.0.0.2"), (1, "worker", "10.0.0.4")]
    sub = sub_membership(m, [m.nodes[2], m.nodes[0]], Path("/efs"))
    assert sub.master.address == "10.0.0.1" and sub.master.instance_type == "p4d.24xlarge"
    assert sub.generation == 4 and all(n.gpus == 8 for n in sub.nodes)


# -- the instance-type cache against moto's server ---------------------------------------------


class CountingEc2:
    def __init__(self, client):
        self.client, self.calls = client, []

    def describe_instance_types(self, **kw):
        self.calls.append(kw["InstanceTypes"])
        return self.client.describe_instance_types(**kw)


def test_instance_types_come_from_describe_instance_types_once(tmp_path, moto_endpoint):
    ec2 = CountingEc2(boto3.client("ec2", region_name=REGION, endpoint_url=moto_endpoint))
    facts = it.instance_type_facts(tmp_path, ["g5.xlarge", "p4d.24xlarge", "c5.xlarge",
                                              "no-such.type"], ec2=ec2)
    assert (facts["g5.xlarge"].gpus, facts["g5.xlarge"].gpu_name) == (1, "A10G")
    assert (facts["p4d.24xlarge"].gpus, facts["p4d.24xlarge"].efa_supported) == (8, True)
    assert (facts["c5.xlarge"].gpus, facts["c5.xlarge"].gpu_name) == (0, "")  # no GpuInfo
    assert "InvalidInstanceType" in facts["no-such.type"]
    cached = store.read_record(ClusterPaths(tmp_path).instance_type("g5.xlarge"),
                               InstanceTypeFacts)
    assert cached == facts["g5.xlarge"]
    assert not ClusterPaths(tmp_path).instance_type("no-such.type").exists()
    calls = len(ec2.calls)
    again = it.instance_type_facts(tmp_path, ["g5.xlarge", "c5.xlarge"], ec2=ec2)
    assert len(ec2.calls) == calls  # from the EFS cache
    assert again["c5.xlarge"] == facts["c5.xlarge"]


def test_efa_attachments_from_describe_instances(moto_reset):
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_reset)
    operator_quotas(moto_reset)  # a p4d.24xlarge fits the account's vCPU quotas
    image = ec2.describe_images()["Images"][0]["ImageId"]
    inst = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1,
                             InstanceType="p4d.24xlarge")["Instances"][0]
    # moto gives every interface the type "interface": none of them is an EFA
    assert it.efa_attachments([inst["InstanceId"]], ec2=ec2) == {inst["InstanceId"]: 0}
    assert it.efa_interfaces({"NetworkInterfaces": [{"InterfaceType": "efa"},
                                                    {"InterfaceType": "interface"},
                                                    {"InterfaceType": "efa-only"}]}) == 2
    with pytest.raises(it.LookupFailed, match="i-0000000000000dead"):
        it.efa_attachments(["i-0000000000000dead"], ec2=ec2)


def test_dcgm_runs_level_one_and_names_a_failed_test(tmp_path, monkeypatch):
    tool = tmp_path / "dcgmi"
    report = {"tests": [{"name": "PCIe", "results": [{"status": "Fail"}]}]}
    tool.write_text(f"#!/bin/sh\n[ \"$*\" = 'diag -r 1 --json' ] || exit 64\n"
                    f"echo '{json.dumps(report)}'\nexit 226\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    line = nc.check_dcgm(5, 8)
    assert (line["status"], line["value"], line["detail"]) == ("error", "fail", "failed: PCIe")
    assert nc.check_dcgm(5, 0)["status"] == "absent"  # no GPU listed: nothing to diagnose
    tool.unlink()
    assert nc.check_dcgm(5, 8)["status"] == "absent"  # no dcgmi: n/a

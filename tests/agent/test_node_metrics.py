"""The node's metrics: EMF lines (bootstrap_scripts/metrics/metrics_emf.py), the GPU readings of
nvidia-smi (bootstrap_scripts/metrics/gpu_metrics.py) and the executor's sampler
(bootstrap_scripts/jobs/executor/gpu_sampler.py), with a stand-in nvidia-smi on PATH."""

from __future__ import annotations

import json
import logging
import stat

import pytest

from bootstrap_scripts.jobs.executor.gpu_sampler import GpuSampler, sample_line
from bootstrap_scripts.metrics import gpu_metrics, metrics_emf, xid_errors
from bootstrap_scripts.metrics import metric_names as names
from emulator import gpus as emulated

NODE = [names.DIM_CLUSTER, names.DIM_INSTANCE]
DIMS = {names.DIM_CLUSTER: "c1", names.DIM_INSTANCE: "i-0abc"}


def test_render_is_the_emf_document_structure() -> None:
    line = metrics_emf.render(namespace="DeepLearningCluster", dimension_sets=[NODE],
                              dimensions=DIMS, timestamp_ms=1700000000123,
                              metrics={"GPUUtilization": (42.5, "Percent"),
                                       "GPUMemoryUsed": (1024, "Megabytes")},
                              properties={"gpus": 8})
    assert "\n" not in line
    assert json.loads(line) == {
        "_aws": {"Timestamp": 1700000000123, "CloudWatchMetrics": [{
            "Namespace": "DeepLearningCluster",
            "Dimensions": [["ClusterId", "InstanceId"]],
            "Metrics": [{"Name": "GPUUtilization", "Unit": "Percent"},
                        {"Name": "GPUMemoryUsed", "Unit": "Megabytes"}]}]},
        "ClusterId": "c1", "InstanceId": "i-0abc",
        "GPUUtilization": 42.5, "GPUMemoryUsed": 1024, "gpus": 8}


def test_render_with_directives_records_a_metric_per_node_and_per_cluster() -> None:
    line = metrics_emf.render(
        namespace="N", dimensions=DIMS, timestamp_ms=1,
        metrics={"A": (1, "Count"), "B": (2, "Count")},
        directives=[([NODE], ["A", "B"]), ([[names.DIM_CLUSTER]], ["A"])])
    assert json.loads(line)["_aws"]["CloudWatchMetrics"] == [
        {"Namespace": "N", "Dimensions": [NODE],
         "Metrics": [{"Name": "A", "Unit": "Count"}, {"Name": "B", "Unit": "Count"}]},
        {"Namespace": "N", "Dimensions": [["ClusterId"]],
         "Metrics": [{"Name": "A", "Unit": "Count"}]}]


@pytest.mark.parametrize("change,match", [
    ({"namespace": "AWS/EC2"}, "namespace"),
    ({"metrics": {}}, "1 to 100"),
    ({"metrics": {f"m{i}": (1, "Count") for i in range(101)}}, "1 to 100"),
    ({"metrics": {"A": (float("nan"), "Count")}}, "finite"),
    ({"metrics": {"A": (True, "Count")}}, "finite"),
    ({"metrics": {"A": (1, "Watts")}}, "unit"),
    ({"metrics": {"ClusterId": (1, "Count")}}, "also a dimension"),
    ({"dimension_sets": [["JobId"]]}, "dimension set"),
    ({"dimensions": {**DIMS, "InstanceId": ""}}, "non-empty"),
    ({"directives": [([NODE], ["Z"])], "dimension_sets": ()}, "directive metrics"),
])
def test_render_refuses_what_cloudwatch_would_not_extract(change, match) -> None:
    args = {"namespace": "N", "dimension_sets": [NODE], "dimensions": DIMS,
            "metrics": {"A": (1, "Count")}, "timestamp_ms": 1, **change}
    with pytest.raises(metrics_emf.EmfError, match=match):
        metrics_emf.render(**args)


def test_append_writes_whole_lines_and_never_through_a_link(tmp_path) -> None:
    path = tmp_path / "metrics.log"
    metrics_emf.append(path, ["a", "b"])
    metrics_emf.append(path, ["c"])
    assert path.read_text() == "a\nb\nc\n"
    link = tmp_path / "link.log"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        metrics_emf.append(link, ["x"])
    assert not (tmp_path / "elsewhere").exists()


CSV = ("0, 87, 15000, 71, 250.50, 0, No\n"
       "1, 13, 1000, 64, 99.50, 2, Yes\n"
       "2, [N/A], [N/A], 60, [Not Supported], [N/A], [N/A]\n")


def test_parse_reads_each_gpu_and_leaves_what_it_does_not_report_unknown() -> None:
    r = gpu_metrics.parse(CSV)
    assert [g.index for g in r] == [0, 1, 2]
    assert r[0] == gpu_metrics.GpuReading(0, 87.0, 15000.0, 71.0, 250.5, 0.0, False)
    assert r[1].retired_pages_pending is True and r[1].ecc_uncorrected == 2.0
    assert r[2].utilization is None and r[2].power_w is None
    assert r[2].retired_pages_pending is None and r[2].temperature_c == 60.0


@pytest.mark.parametrize("bad", ["0, 1, 2", "GPU 0: Tesla", "x, 1, 2, 3, 4, 5, No"])
def test_parse_refuses_an_answer_of_another_shape(bad) -> None:
    with pytest.raises(gpu_metrics.GpuQueryError):
        gpu_metrics.parse(bad)


def test_node_metrics_aggregate_the_gpus() -> None:
    assert gpu_metrics.node_metrics(gpu_metrics.parse(CSV)) == {
        names.METRIC_GPU_UTILIZATION: (50.0, "Percent"),  # mean of the GPUs reporting it
        names.METRIC_GPU_MEMORY_USED: (16000.0, "Megabytes"),
        names.METRIC_GPU_TEMPERATURE: (71.0, "None"),  # the hottest
        names.METRIC_GPU_POWER: (350.0, "None"),
        names.METRIC_GPU_ECC_UNCORRECTED: (2.0, "Count"),
        names.METRIC_GPU_RETIRED_PAGES_PENDING: (1.0, "Count")}
    assert gpu_metrics.node_metrics([]) == {}


def test_sample_line_is_per_node_and_utilization_per_cluster_too() -> None:
    doc = json.loads(sample_line(gpu_metrics.parse(CSV), "c1", "i-0abc", 5))
    per_node, per_cluster = doc["_aws"]["CloudWatchMetrics"]
    assert per_node["Namespace"] == names.NAMESPACE and per_node["Dimensions"] == [NODE]
    assert len(per_node["Metrics"]) == 6
    assert per_cluster["Dimensions"] == [["ClusterId"]]
    assert per_cluster["Metrics"] == [{"Name": "GPUUtilization", "Unit": "Percent"}]
    assert doc["GPUUtilization"] == 50.0 and doc["InstanceId"] == "i-0abc"


def test_xids_are_counted_per_node_and_per_cluster() -> None:
    doc = json.loads(sample_line(gpu_metrics.parse(CSV), "c1", "i-0abc", 5, xids=2))
    per_node, per_cluster = doc["_aws"]["CloudWatchMetrics"]
    assert {"Name": "GPUXidErrors", "Unit": "Count"} in per_node["Metrics"]
    assert {"Name": "GPUXidErrors", "Unit": "Count"} in per_cluster["Metrics"]
    assert doc["GPUXidErrors"] == 2.0


def test_xid_records_are_parsed_from_kernel_log_records() -> None:
    records = [
        "6,1201,51409,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has "
        "fallen off the bus.",
        "4,1202,51410,-;NVRM: Xid (PCI:0000:86:00): 48, pid=77, An uncorrectable double bit "
        "error",
        "6,1203,51411,-;nvidia-nvlink: Unregistered Nvlink Core",  # not an XID
        "6,1204,51412,-;user said NVRM: Xid (PCI:x): abc",  # no code: not an XID
    ]
    assert xid_errors.parse(records) == [("PCI:0000:3b:00", 79), ("PCI:0000:86:00", 48)]


def test_only_xids_written_after_the_sampler_started_count_once_each(tmp_path) -> None:
    """The kernel log is read from its end; each sample counts what came since the last
    (a regular file at ``<root>/dev/kmsg`` reads as /dev/kmsg does)."""
    kmsg = tmp_path / "dev" / "kmsg"
    kmsg.parent.mkdir()
    kmsg.write_text("6,1,1,-;NVRM: Xid (PCI:0000:3b:00): 13, before the sampler\n")
    log = xid_errors.KernelLog(tmp_path)
    assert log.read() == []
    with kmsg.open("a") as f:
        f.write("6,2,2,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
        f.write("6,3,3,-;eth0: link up\n")
    assert xid_errors.parse(log.read()) == [("PCI:0000:3b:00", 79)]
    assert log.read() == []
    log.close()


def test_without_a_kernel_log_no_xid_metric_and_the_reason_is_kept(tmp_path) -> None:
    log = xid_errors.KernelLog(tmp_path)
    assert log.read() is None and "dev/kmsg" in log.problem
    doc = json.loads(sample_line(gpu_metrics.parse(CSV), "c1", "i-0abc", 5, xids=None))
    assert "GPUXidErrors" not in doc


def test_the_sampler_counts_xids_in_its_lines(tmp_path, monkeypatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "answer.csv").write_text(CSV)
    script(bindir, f"cat {tmp_path / 'answer.csv'}\n")
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    (tmp_path / "var/log/dl-cluster").mkdir(parents=True)
    kmsg = tmp_path / "dev" / "kmsg"
    kmsg.parent.mkdir()
    kmsg.write_text("")
    sampler = GpuSampler(tmp_path, lambda: ("c1", "i-0abc"))
    assert sampler.sample_once()
    kmsg.write_text("6,9,9,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    assert sampler.sample_once() and sampler.sample_once()
    lines = metrics_emf.metrics_log(tmp_path).read_text().splitlines()
    assert [json.loads(x)["GPUXidErrors"] for x in lines] == [0.0, 1.0, 0.0]


def script(directory, body: str) -> None:
    path = directory / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_sampler_writes_one_emf_line_per_sample_from_nvidia_smi(
        tmp_path, monkeypatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # answers only the exact query the sampler makes, as the real program would be asked
    (tmp_path / "answer.csv").write_text(CSV)
    script(bindir, f'[ "$1" = "{gpu_metrics.COMMAND[1]}" ] && [ "$2" = "{gpu_metrics.COMMAND[2]}"'
                   f' ] || exit 2\ncat {tmp_path / "answer.csv"}\n')
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    (tmp_path / "var/log/dl-cluster").mkdir(parents=True)
    sampler = GpuSampler(tmp_path, lambda: ("c1", "i-0abc"))
    assert sampler.sample_once() and sampler.sample_once()
    lines = metrics_emf.metrics_log(tmp_path).read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0])["GPUUtilization"] == 50.0


def test_without_nvidia_smi_nothing_is_written_and_it_is_said_once(
        tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    sampler = GpuSampler(tmp_path, lambda: ("c1", "i-0abc"))
    with caplog.at_level(logging.WARNING):
        assert not sampler.sample_once() and not sampler.sample_once()
    assert [r.getMessage() for r in caplog.records] == [
        "GPU metrics: no nvidia-smi on PATH; none emitted until it answers"]
    assert not metrics_emf.metrics_log(tmp_path).exists()


def test_a_failing_driver_or_an_unknown_node_emits_nothing(tmp_path, monkeypatch) -> None:
    bindir = tmp_path / "usr/bin"
    emulated.fake_nvidia_smi(bindir, 2, fault=True)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    assert not GpuSampler(tmp_path, lambda: ("c1", "i-0abc")).sample_once()
    assert not GpuSampler(tmp_path, lambda: None).sample_once()
    assert not metrics_emf.metrics_log(tmp_path).exists()


def test_the_emulators_nvidia_smi_answers_the_samplers_query(tmp_path, monkeypatch) -> None:
    bindir = emulated.fake_nvidia_smi(tmp_path / emulated.NODE_BIN_DIR, 2)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    idle = gpu_metrics.query()
    assert [(g.index, g.utilization, g.retired_pages_pending) for g in idle] == [
        (0, 0.0, False), (1, 0.0, False)]
    emulated.set_gpu_utilization(tmp_path, 60)
    busy = gpu_metrics.node_metrics(gpu_metrics.query())
    assert busy[names.METRIC_GPU_UTILIZATION] == (60.0, "Percent")
    assert busy[names.METRIC_GPU_TEMPERATURE][0] > 35
    emulated.inject_gpu_fault(tmp_path)
    with pytest.raises(gpu_metrics.GpuQueryError, match="exited 9"):
        gpu_metrics.query()


def test_the_executor_samples_with_the_ids_of_the_membership_it_applied(
        tmp_path, monkeypatch) -> None:
    from bootstrap_scripts.jobs.executor.daemon import Executor
    from bootstrap_scripts.protocol.membership import build_membership
    from bootstrap_scripts.protocol.paths import NodePaths

    ex = Executor(tmp_path / "node", tmp_path / "efs", "127.0.0.12")
    assert ex.identity() is None  # no membership yet: no metric
    m = build_membership(cluster_id="c1", generation=1,
                         master={"instance_id": "i-0mmm", "address": "127.0.0.11"},
                         workers=[{"instance_id": "i-0www", "address": "127.0.0.12"}])
    path = NodePaths(tmp_path / "node").membership
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(m.to_json())
    assert ex.identity() == ("c1", "i-0www")
    bindir = emulated.fake_nvidia_smi(tmp_path / "node" / emulated.NODE_BIN_DIR, 1)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    (tmp_path / "node/var/log/dl-cluster").mkdir(parents=True)
    assert ex.gpu_sampler.sample_once()
    doc = json.loads(metrics_emf.metrics_log(tmp_path / "node").read_text())
    assert (doc["ClusterId"], doc["InstanceId"], doc["GPUUtilization"]) == ("c1", "i-0www", 0.0)

"""EFA's counters as metrics (bootstrap_scripts/metrics/efa_counters.py): read from a sysfs laid out
as the EFA driver lays it out, what grew since the previous sample, summed over devices
and ports; nothing on a node without EFA; other RDMA drivers and missing counters left out."""

from __future__ import annotations

import os
from pathlib import Path

from bootstrap_scripts.jobs.executor.gpu_sampler import sample_line
from bootstrap_scripts.metrics import efa_counters, gpu_metrics
from bootstrap_scripts.metrics import metric_names as names


def device(root: Path, name: str, driver: str, counters: dict[str, int], port: str = "1") -> Path:
    """``sys/class/infiniband/<name>`` with its driver link and the port's hw_counters."""
    base = root / efa_counters.SYSFS_DIR / name
    (root / "sys/bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
    (base / "device").mkdir(parents=True, exist_ok=True)
    link = base / "device" / "driver"
    if not link.is_symlink():
        os.symlink(root / "sys/bus/pci/drivers" / driver, link)
    hw = base / "ports" / port / "hw_counters"
    hw.mkdir(parents=True, exist_ok=True)
    for counter, value in counters.items():
        (hw / counter).write_text(f"{value}\n")
    return hw


def test_no_efa_device_no_metric(tmp_path: Path) -> None:
    assert efa_counters.EfaCounters(tmp_path).sample() is None
    device(tmp_path, "mlx5_0", "mlx5_core", {"tx_bytes": 10})  # not an EFA
    assert efa_counters.EfaCounters(tmp_path).sample() is None


def test_growth_since_the_last_sample_summed_over_devices(tmp_path: Path) -> None:
    a = device(tmp_path, "rdmap16s27", "efa", {"tx_bytes": 1000, "rx_bytes": 50,
                                               "rx_drops": 0, "retrans_pkts": 3})
    b = device(tmp_path, "rdmap32s27", "efa", {"tx_bytes": 500, "rx_bytes": 5,
                                               "rx_drops": 1, "retrans_pkts": 0})
    sampler = efa_counters.EfaCounters(tmp_path)
    first = sampler.sample()
    assert first is not None and all(v == 0.0 for v, _ in first.values())  # the baseline
    (a / "tx_bytes").write_text("4000\n")
    (b / "tx_bytes").write_text("1500\n")
    (b / "rx_drops").write_text("3\n")
    grown = sampler.sample()
    assert grown[names.METRIC_EFA_TX_BYTES] == (4000.0, "Bytes")  # 3000 + 1000
    assert grown[names.METRIC_EFA_RX_DROPS] == (2.0, "Count")
    assert grown[names.METRIC_EFA_RETRANSMITTED_PACKETS] == (0.0, "Count")
    # counters an older driver lacks are absent, not zero
    assert names.METRIC_EFA_IMPAIRED_CONNECTIONS not in grown


def test_a_counter_that_went_back_counts_from_zero(tmp_path: Path) -> None:
    """A driver reload starts the counters again: the new value is what grew."""
    hw = device(tmp_path, "efa_0", "efa", {"rx_bytes": 9000})
    sampler = efa_counters.EfaCounters(tmp_path)
    sampler.sample()
    (hw / "rx_bytes").write_text("700\n")
    assert sampler.sample()[names.METRIC_EFA_RX_BYTES] == (700.0, "Bytes")


def test_the_sample_line_carries_the_efa_metrics_per_node(tmp_path: Path) -> None:
    import json

    readings = gpu_metrics.parse("0, 57, 1200, 61, 120.50, 0, No\n")
    line = sample_line(readings, "c1", "i-0abc", 1, efa={names.METRIC_EFA_TX_BYTES:
                                                         (42.0, "Bytes")})
    doc = json.loads(line)
    assert doc[names.METRIC_EFA_TX_BYTES] == 42.0
    node, *_ = doc["_aws"]["CloudWatchMetrics"]
    assert {"Name": names.METRIC_EFA_TX_BYTES, "Unit": "Bytes"} in node["Metrics"]
    assert node["Dimensions"] == [[names.DIM_CLUSTER, names.DIM_INSTANCE]]

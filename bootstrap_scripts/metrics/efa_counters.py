"""EFA's hardware counters, per sample: what a node's Elastic Fabric Adapters moved and lost.

The EFA kernel driver exposes each adapter's counters in sysfs, one file per counter, under
``/sys/class/infiniband/<device>/ports/<port>/hw_counters/`` (the RDMA subsystem's place for
them; device names are ``efa_N`` or ``rdmapNsM`` depending on the kernel). The counters only
grow (a driver reload starts them again from zero). Each sample here is what grew since the
previous one, summed over every EFA device and port of the node; the first sample is the
baseline (zeros). Counters an older driver lacks (the SRD retransmission and remote-health
ones came later) are left out, not reported as zero.

A device is an EFA when its ``device/driver`` link names the ``efa`` driver: other RDMA
devices (none on EC2 today) are not counted. No EFA device: no EFA metric at all.

AWS: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html (EFA), and the driver's
own counter names (the Linux kernel, ``drivers/infiniband/hw/efa``). Read by root (the job
executor's sampler); sysfs files are not a user's path.
"""

from __future__ import annotations

import os
from pathlib import Path

from bootstrap_scripts.metrics import metric_names as names

#: Where the RDMA devices are, under a node's root.
SYSFS_DIR = "sys/class/infiniband"
#: The driver an EFA device is bound to.
EFA_DRIVER = "efa"
#: counter file -> (metric, unit): what the dashboard graphs.
COUNTERS: dict[str, tuple[str, str]] = {
    "tx_bytes": (names.METRIC_EFA_TX_BYTES, "Bytes"),
    "rx_bytes": (names.METRIC_EFA_RX_BYTES, "Bytes"),
    "rdma_read_bytes": (names.METRIC_EFA_RDMA_READ_BYTES, "Bytes"),
    "rdma_write_bytes": (names.METRIC_EFA_RDMA_WRITE_BYTES, "Bytes"),
    "rx_drops": (names.METRIC_EFA_RX_DROPS, "Count"),
    "retrans_pkts": (names.METRIC_EFA_RETRANSMITTED_PACKETS, "Count"),
    "unresponsive_remote_events": (names.METRIC_EFA_UNRESPONSIVE_REMOTES, "Count"),
    "impaired_remote_conn_events": (names.METRIC_EFA_IMPAIRED_CONNECTIONS, "Count"),
}


def efa_devices(root: Path) -> list[Path]:
    """This node's EFA devices (their sysfs directories), sorted."""
    base = Path(root) / SYSFS_DIR
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    return [d for d in entries
            if os.path.basename(os.path.realpath(d / "device" / "driver")) == EFA_DRIVER]


def read_counters(root: Path) -> dict[tuple[str, str, str], int]:
    """(device, port, counter) -> value of every counter in :data:`COUNTERS` present."""
    out: dict[tuple[str, str, str], int] = {}
    for device in efa_devices(root):
        try:
            ports = sorted((device / "ports").iterdir())
        except OSError:
            continue
        for port in ports:
            for counter in COUNTERS:
                try:
                    text = (port / "hw_counters" / counter).read_text()
                except OSError:
                    continue  # an older driver: no such counter
                if text.strip().isdigit():
                    out[(device.name, port.name, counter)] = int(text)
    return out


class EfaCounters:
    """The node's EFA counters since the previous :meth:`sample`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.last: dict[tuple[str, str, str], int] | None = None

    def sample(self) -> dict[str, tuple[float, str]] | None:
        """metric -> (growth since the previous sample, unit), summed over every EFA device
        and port; None when the node has no EFA device."""
        now = read_counters(self.root)
        if not now:
            self.last = None
            return None
        previous, self.last = self.last, now
        sums: dict[str, tuple[float, str]] = {}
        for key, value in now.items():
            metric, unit = COUNTERS[key[2]]
            before = previous.get(key) if previous is not None else value
            grown = value - before if before is not None and value >= before else value
            total = sums.get(metric, (0.0, unit))[0]
            sums[metric] = (total + grown, unit)
        return sums

"""The executor's GPU sampler: every :data:`SAMPLE_SECONDS`, this node's GPU readings as
one EMF line (``bootstrap_scripts.metrics.metrics_emf``) in the node's metrics file, which the
CloudWatch agent ships to ``<instance-id>/metrics`` and CloudWatch Logs turns into metrics.

Why a thread: ``nvidia-smi`` takes tens of milliseconds on a healthy node and can hang for
its whole timeout on a sick one; the executor's loop (0.2 s) must not wait for it. The
thread shares nothing with the loop but the node's files it reads (the membership: the
cluster id and this node's instance id) and the file it appends to.

Dimensions: every metric per node (``ClusterId`` + ``InstanceId``); ``GPUUtilization``
and ``GPUXidErrors`` also per cluster (``ClusterId`` alone), so CloudWatch's average over
every node's samples is the cluster's figure the dashboard and the idle alarm read, and the
XID alarm sums every node's.

``GPUXidErrors``: the XID records the driver wrote to the kernel log since the last sample
(``bootstrap_scripts.metrics.xid_errors``), per node; left out where ``/dev/kmsg`` cannot be read.
``EFA*``: what the node's EFA counters grew since the last sample
(``bootstrap_scripts.metrics.efa_counters``), per node; only on a node with EFA.

Failure-tolerant: no nvidia-smi, a failing driver, an unknown identity or an unwritable
file cost one log line (again only once the cause changes) and no metric; the next
sample tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bootstrap_scripts.metrics import (
    dcgm_metrics,
    efa_counters,
    gpu_metrics,
    metrics_emf,
    xid_errors,
)
from bootstrap_scripts.metrics import metric_names as names

LOG = logging.getLogger("dl-executor.gpu-metrics")

#: Seconds between two samples (two per minute: the dashboard's and alarms' period).
SAMPLE_SECONDS = 30.0

#: (cluster id, instance id) of this node, None while the node agent has not said.
Identity = Callable[[], "tuple[str, str] | None"]


def sample_line(readings: list[gpu_metrics.GpuReading], cluster_id: str, instance_id: str,
                timestamp_ms: int, *, xids: int | None = None,
                efa: dict[str, tuple[float, str]] | None = None,
                profiling: dict[str, tuple[float, str]] | None = None) -> str | None:
    """The EMF line of one sample (None when no GPU reported anything): every metric per
    node, and ``GPUUtilization`` per cluster too (a second directive of the same event).
    ``xids``: the XID records since the last sample (None: the kernel log is not read);
    ``efa``: the EFA counters' growth (None: no EFA on this node); ``profiling``: DCGM's
    activity metrics (None: no DCGM)."""
    metrics = gpu_metrics.node_metrics(readings)
    if not metrics:
        return None
    if xids is not None:
        metrics[names.METRIC_GPU_XID_ERRORS] = (float(xids), "Count")
    metrics.update(efa or {})
    metrics.update(profiling or {})
    directives: list[metrics_emf.Directive] = [
        ([[names.DIM_CLUSTER, names.DIM_INSTANCE]], list(metrics))]
    # per cluster too: the mean utilisation (dashboard, idle alarm), the XIDs (their alarm)
    cluster = [m for m in (names.METRIC_GPU_UTILIZATION, names.METRIC_GPU_XID_ERRORS)
               if m in metrics]
    if cluster:
        directives.append(([[names.DIM_CLUSTER]], cluster))
    return metrics_emf.render(
        namespace=names.NAMESPACE, directives=directives, metrics=metrics,
        dimensions={names.DIM_CLUSTER: cluster_id, names.DIM_INSTANCE: instance_id},
        timestamp_ms=timestamp_ms, properties={"gpus": len(readings)})


class GpuSampler:
    """Samples in a daemon thread until :meth:`stop`; :meth:`sample_once` is one sample."""

    def __init__(self, root: Path, identity: Identity, *,
                 interval: float = SAMPLE_SECONDS) -> None:
        self.path = metrics_emf.metrics_log(root)
        self.kernel_log = xid_errors.KernelLog(root)
        self.efa = efa_counters.EfaCounters(root)
        self.kernel_log_said = ""  # the kernel log's problem last logged
        self.dcgm_said = ""  # why DCGM gave nothing, last logged
        self.identity = identity
        self.interval = interval
        self.last_problem = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _problem(self, text: str) -> None:
        if text != self.last_problem:
            LOG.warning("GPU metrics: %s; none emitted until it answers", text)
        self.last_problem = text

    def sample_once(self) -> bool:
        """One sample: True when a line was written."""
        ident = self.identity()
        if ident is None or not all(ident):
            self._problem("this node's cluster id or instance id is not known yet")
            return False
        try:
            readings = gpu_metrics.query()
        except gpu_metrics.GpuQueryError as exc:
            self._problem(str(exc))
            return False
        line = sample_line(readings, ident[0], ident[1], int(time.time() * 1000),
                           xids=self._xids(), efa=self.efa.sample(),
                           profiling=self._profiling())
        if line is None:
            self._problem("no GPU reported a reading")
            return False
        try:
            metrics_emf.append(self.path, [line])
        except OSError as exc:
            self._problem(f"cannot append to {self.path}: {exc}")
            return False
        if self.last_problem:
            LOG.info("GPU metrics: sampling again (%d GPUs)", len(readings))
        self.last_problem = ""
        return True

    def _profiling(self) -> dict[str, tuple[float, str]] | None:
        """DCGM's activity metrics; None without DCGM (why said once, and again after it
        answered in between)."""
        try:
            metrics = dcgm_metrics.query()
        except dcgm_metrics.DcgmUnavailable as exc:
            if str(exc) != self.dcgm_said:
                LOG.info("GPU metrics: no DCGM profiling metrics: %s", exc)
                self.dcgm_said = str(exc)
            return None
        self.dcgm_said = ""
        return metrics

    def _xids(self) -> int | None:
        """XID records since the last sample, logged as they come; None without a kernel
        log (said once)."""
        try:
            records = self.kernel_log.read()
        except OSError as exc:
            records, self.kernel_log.problem = None, f"reading the kernel log: {exc}"
        if records is None:
            if self.kernel_log.problem != self.kernel_log_said:
                LOG.info("GPU metrics: no XID errors counted: %s", self.kernel_log.problem)
                self.kernel_log_said = self.kernel_log.problem
            return None
        found = xid_errors.parse(records)
        for device, code in found:
            LOG.warning("GPU XID %d on %s (NVIDIA's XID list says what it means)", code,
                        device)
        return len(found)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # never let the thread die silently
                LOG.exception("GPU metrics: sample failed")
            self._stop.wait(self.interval)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpu-metrics", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

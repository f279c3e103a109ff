"""Reading a cluster's metrics back from (emulated) CloudWatch, as its dashboard reads them:
namespace and dimension names from ``bootstrap_scripts/metrics/metric_names.py``, one exact
dimension set per query (GetMetricData matches a metric's whole dimension set)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bootstrap_scripts.metrics import metric_names as names
from bootstrap_scripts.metrics.metrics_emf import METRICS_LOG

#: The per-node GPU metrics the executors' samplers publish (``gpu_metrics.node_metrics``).
GPU_METRICS = (names.METRIC_GPU_UTILIZATION, names.METRIC_GPU_MEMORY_USED,
               names.METRIC_GPU_TEMPERATURE, names.METRIC_GPU_POWER,
               names.METRIC_GPU_ECC_UNCORRECTED, names.METRIC_GPU_RETIRED_PAGES_PENDING,
               # DCGM's, from the emulated GPU's dcgmi (the GPU DLAMIs ship DCGM)
               names.METRIC_GPU_SM_ACTIVE, names.METRIC_GPU_TENSOR_ACTIVE,
               names.METRIC_GPU_DRAM_ACTIVE)
#: The per-job metrics the controller publishes from its ranks' progress.
JOB_METRICS = (names.METRIC_STEP_TIME, names.METRIC_SAMPLES_PER_SECOND, names.METRIC_LOSS)


def values(cw, name: str, dimensions: dict[str, str], stat: str = "Average",
           hours: float = 3.0) -> list[float]:
    """The one-minute ``stat`` of ``name`` under exactly ``dimensions`` over the last
    ``hours``, newest first ([] when CloudWatch has no point)."""
    now = datetime.now(UTC)
    res = cw.get_metric_data(
        MetricDataQueries=[{"Id": "m", "MetricStat": {"Metric": {
            "Namespace": names.NAMESPACE, "MetricName": name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()]},
            "Period": 60, "Stat": stat}}],
        StartTime=now - timedelta(hours=hours), EndTime=now + timedelta(minutes=5),
        ScanBy="TimestampDescending")
    return [float(v) for r in res["MetricDataResults"] for v in r["Values"]]


def dimension_sets(cw, name: str) -> list[dict[str, str]]:
    """Every dimension set ListMetrics has for ``name`` in the cluster's namespace."""
    out = []
    for page in cw.get_paginator("list_metrics").paginate(Namespace=names.NAMESPACE,
                                                          MetricName=name):
        out += [{d["Name"]: d["Value"] for d in m["Dimensions"]} for m in page["Metrics"]]
    return out


def missing(cw, cluster: str, instances: set[str], jobs: set[str]) -> list[str]:
    """What is not (yet) in CloudWatch of what the nodes publish: each instance's GPU
    metrics, the cluster's GPU mean, JobsRunning, UnhealthyNodes, each job's figures."""
    c = {names.DIM_CLUSTER: cluster}
    wanted = [(n, {**c, names.DIM_INSTANCE: i}) for i in sorted(instances) for n in GPU_METRICS]
    wanted += [(names.METRIC_GPU_UTILIZATION, c), (names.METRIC_JOBS_RUNNING, c),
               (names.METRIC_UNHEALTHY_NODES, c)]
    wanted += [(n, {**c, names.DIM_JOB: j}) for j in sorted(jobs) for n in JOB_METRICS]
    return [f"{n} {d}" for n, d in wanted if not values(cw, n, d)]


def written(roots: list[str]) -> dict[str, int]:
    """How many EMF lines under each metric name the nodes at ``roots`` wrote to their
    metrics files (what a failure message shows beside what CloudWatch has)."""
    count: Counter[str] = Counter()
    for root in roots:
        try:
            text = (Path(root) / METRICS_LOG).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            count.update(m["Name"] for d in doc["_aws"]["CloudWatchMetrics"]
                         for m in d["Metrics"])
    return dict(count)

"""CloudWatch Logs' embedded metric format extraction, which moto's CloudWatch Logs lacks.

On AWS, CloudWatch Logs turns every event it receives that is an EMF document into metric
data points of the document's namespace, dimensions and units, by itself
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html):
the nodes only append EMF lines to a file their CloudWatch agent ships
(``bootstrap_scripts/metrics/metrics_emf.py``). moto stores such events as plain log events, so the
dashboard's and the alarms' metrics would stay empty in the emulator. The emulated agent
(``emulator.cloudwatch_agent``) therefore passes each line it uploaded to :func:`datums`
and publishes what comes out with ``PutMetricData`` to moto's CloudWatch: AWS's side of
the contract, played where the lines cross into "AWS"; the product does nothing for it.

Like CloudWatch Logs, a line that is not a valid EMF document is kept as a log event and
yields no metric (here: silently; AWS counts it in ``AWS/Logs``' EMF validation metrics).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime


def datums(line: str) -> list[tuple[str, dict]]:
    """(namespace, PutMetricData ``MetricData`` entry) for each metric of each dimension
    set of an EMF line; [] for a line that is not one."""
    try:
        doc = json.loads(line)
        meta = doc["_aws"]
        stamp = datetime.fromtimestamp(int(meta["Timestamp"]) / 1000, tz=UTC)
        out = []
        for directive in meta["CloudWatchMetrics"]:
            namespace = str(directive["Namespace"])
            for dims in directive["Dimensions"]:
                dimensions = [{"Name": d, "Value": str(doc[d])} for d in dims]
                for metric in directive["Metrics"]:
                    name = metric["Name"]
                    value = doc[name]
                    if isinstance(value, bool) or not isinstance(value, int | float) or \
                            not math.isfinite(value):
                        return []
                    out.append((namespace, {
                        "MetricName": name, "Dimensions": dimensions, "Timestamp": stamp,
                        "Value": float(value), "Unit": metric.get("Unit", "None")}))
        return out
    except (ValueError, KeyError, TypeError, OverflowError, OSError):
        return []


def publish(client, lines: list[str]) -> int:
    """PutMetricData for every EMF line of ``lines`` (``client``: CloudWatch); returns the
    data points sent. Lines without ``_aws`` are skipped without parsing them."""
    by_namespace: dict[str, list[dict]] = {}
    for line in lines:
        if '"_aws"' in line:
            for namespace, datum in datums(line):
                by_namespace.setdefault(namespace, []).append(datum)
    sent = 0
    for namespace, data in by_namespace.items():
        for i in range(0, len(data), 500):  # PutMetricData: at most 1,000 per call
            client.put_metric_data(Namespace=namespace, MetricData=data[i:i + 500])
            sent += len(data[i:i + 500])
    return sent

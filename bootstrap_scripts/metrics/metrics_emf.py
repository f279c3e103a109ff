"""The cluster's metrics as CloudWatch embedded metric format (EMF) log lines.

Why EMF rather than ``PutMetricData``: every node already ships files to the cluster's log
group with the CloudWatch agent (``bootstrap_scripts/agent/cloudwatch_config.py``), and
CloudWatch Logs turns each EMF event it receives into metric data points by itself. So a
sample costs one line appended to a node-local file (:data:`METRICS_LOG`, stream
``<instance-id>/metrics``): no AWS call, no extra permission (the node role's
``logs:PutLogEvents`` is enough), nothing lost while the network is down (the agent ships
the file when it can), and the raw samples stay searchable in CloudWatch Logs Insights.

The document structure is AWS's specification
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html):
one JSON object per line, its root holding ``_aws`` = {``Timestamp`` (ms since the epoch),
``CloudWatchMetrics``: [{``Namespace``, ``Dimensions`` (a list of dimension sets, each a
list of root member names), ``Metrics``: [{``Name``, ``Unit``}]}]}, and, beside ``_aws``,
each dimension's value (a string) and each metric's value (a number) under its name.
A set has at most :data:`MAX_DIMENSIONS` dimensions and a directive at most
:data:`MAX_METRICS` metrics; a line is an ordinary log event (at most 1 MB).

Pure (stdlib only): :func:`render` returns the line, :func:`append` writes it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Where a node's metric lines go, relative to its root (the agent ships it; logrotate's
#: rule for ``var/log/dl-cluster/*.log`` rotates it with ``copytruncate``).
METRICS_LOG = "var/log/dl-cluster/metrics.log"
#: The specification's limits: dimensions per set, metrics per directive.
MAX_DIMENSIONS = 30
MAX_METRICS = 100
#: The units this module accepts (CloudWatch's ``StandardUnit`` names it uses).
UNITS = frozenset({"None", "Percent", "Count", "Seconds", "Bytes", "Megabytes", "Count/Second"})
#: A line's most bytes (a CloudWatch Logs event, less the agent's per-event overhead).
MAX_LINE_BYTES = 1_048_576 - 26


class EmfError(ValueError):
    """The arguments cannot make a valid EMF document (the message names which)."""


#: One directive: the dimension sets, and the names of the metrics recorded under them.
Directive = tuple[Sequence[Sequence[str]], Sequence[str]]


def render(*, namespace: str, dimensions: Mapping[str, str],
           metrics: Mapping[str, tuple[float, str]], timestamp_ms: int,
           dimension_sets: Sequence[Sequence[str]] = (),
           directives: Sequence[Directive] = (),
           properties: Mapping[str, object] | None = None) -> str:
    """One EMF line (no newline). ``metrics`` are ``name -> (value, unit)``; each is
    recorded under every set of ``dimension_sets`` (each set names keys of
    ``dimensions``), or, given ``directives``, under the sets of each directive naming it
    (one ``CloudWatchMetrics`` entry per directive: how one event records a metric per
    node and another per cluster). ``properties`` are extra root members, kept in the log
    event, neither metric nor dimension."""
    if not namespace or namespace.startswith("AWS/"):
        raise EmfError(f"namespace {namespace!r}: a custom namespace is needed")
    if not metrics or len(metrics) > MAX_METRICS:
        raise EmfError(f"1 to {MAX_METRICS} metrics per line, got {len(metrics)}")
    if not directives:
        directives = [(dimension_sets, list(metrics))]
    elif dimension_sets:
        raise EmfError("dimension_sets or directives, not both")
    root: dict[str, object] = dict(properties or {})
    for key, value in dimensions.items():
        if not isinstance(value, str) or not value:
            raise EmfError(f"dimension {key!r}: a non-empty string, got {value!r}")
        root[key] = value
    for name, (value, unit) in metrics.items():
        if unit not in UNITS:
            raise EmfError(f"metric {name!r}: unit {unit!r} is not one of {sorted(UNITS)}")
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value):
            raise EmfError(f"metric {name!r}: a finite number, got {value!r}")
        if name in dimensions or name == "_aws":
            raise EmfError(f"metric {name!r} is also a dimension")
        root[name] = value
    entries = []
    for sets, metric_names in directives:
        for dims in sets:
            if len(dims) > MAX_DIMENSIONS or any(d not in dimensions for d in dims):
                raise EmfError(f"dimension set {list(dims)}: at most {MAX_DIMENSIONS} of "
                               f"{sorted(dimensions)}")
        unknown = [n for n in metric_names if n not in metrics]
        if unknown or not metric_names:
            raise EmfError(f"directive metrics {list(metric_names)}: each one of "
                           f"{sorted(metrics)}")
        entries.append({"Namespace": namespace, "Dimensions": [list(d) for d in sets],
                        "Metrics": [{"Name": n, "Unit": metrics[n][1]} for n in metric_names]})
    root["_aws"] = {"Timestamp": int(timestamp_ms), "CloudWatchMetrics": entries}
    line = json.dumps(root, sort_keys=True, separators=(",", ":"))
    if len(line.encode()) > MAX_LINE_BYTES:
        raise EmfError(f"line of {len(line.encode())} bytes: at most {MAX_LINE_BYTES}")
    return line


def metrics_log(root: str | Path) -> Path:
    """The node's metrics file under ``root``."""
    return Path(root) / METRICS_LOG


def append(path: Path, lines: Sequence[str]) -> None:
    """Append ``lines`` in one write (``O_APPEND``: the executor and the controller share
    the file, and a write of whole lines never interleaves with theirs); never through a
    link. OSError when the file cannot be written."""
    if not lines:
        return
    data = "".join(line + "\n" for line in lines).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)

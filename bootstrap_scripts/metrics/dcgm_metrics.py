"""A node's GPU profiling activity from DCGM, where the image has it.

``nvidia-smi``'s utilisation says only that *a* kernel ran during the sample: a GPU at 100 %
can have its tensor cores idle (a memory-bound or badly fused model). NVIDIA's Data Center
GPU Manager measures what the hardware actually did. Where ``dcgmi`` is on ``PATH`` (and its
host engine runs), :func:`query` runs ``dcgmi dmon -e 1002,1004,1005 -c 2 -d 1000``: the
profiling fields ``DCGM_FI_PROF_SM_ACTIVE`` (1002), ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``
(1004) and ``DCGM_FI_PROF_DRAM_ACTIVE`` (1005), ratios 0..1 per GPU (NVIDIA's "dcgmi dmon"
reference, https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-dmon.html,
and its profiling metrics). ``dmon`` prints a header (``#Entity`` and the fields' short
names, then ``ID``) and one row per GPU and sample, ``GPU <n>`` then the values; a value not
collected yet (the first sample often) is ``N/A``, so two samples are asked and each GPU's
last known value is kept.

The node's metrics are the GPUs' means in percent (:data:`FIELDS`). No ``dcgmi``, no host
engine or no profiling module (some GPUs, or another profiler holding the counters) raises
:class:`DcgmUnavailable`, which the sampler says once and then leaves these metrics out.
"""

from __future__ import annotations

import shutil
import subprocess
from statistics import fmean

from bootstrap_scripts.metrics import metric_names as names

#: DCGM field id -> the metric it becomes (percent of time, the GPUs' mean).
FIELDS = {1002: names.METRIC_GPU_SM_ACTIVE, 1004: names.METRIC_GPU_TENSOR_ACTIVE,
          1005: names.METRIC_GPU_DRAM_ACTIVE}
COMMAND = ("dcgmi", "dmon", "-e", ",".join(str(f) for f in FIELDS), "-c", "2", "-d", "1000")
#: Seconds ``dmon`` may take for its two samples (a host engine in trouble can hang it).
TIMEOUT_SECONDS = 10.0


class DcgmUnavailable(RuntimeError):
    """DCGM gave no usable answer (the message says why)."""


def parse(output: str) -> dict[int, list[float | None]]:
    """GPU index -> the fields' last known values (in :data:`FIELDS`' order), from ``dmon``'s
    rows; header, blank and error lines are skipped."""
    out: dict[int, list[float | None]] = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) != 2 + len(FIELDS) or parts[0] != "GPU" or not parts[1].isdigit():
            continue
        last = out.setdefault(int(parts[1]), [None] * len(FIELDS))
        for i, text in enumerate(parts[2:]):
            try:
                value = float(text)
            except ValueError:
                continue  # N/A: keep what the earlier sample said
            if 0.0 <= value <= 1.0:
                last[i] = value
    return out


def node_metrics(values: dict[int, list[float | None]]) -> dict[str, tuple[float, str]]:
    """The node's metrics (``name -> (value, unit)``): each field's mean over the GPUs that
    reported it, in percent; a field no GPU reported is left out."""
    out: dict[str, tuple[float, str]] = {}
    for i, name in enumerate(FIELDS.values()):
        known = [v[i] for v in values.values() if v[i] is not None]
        if known:
            out[name] = (round(100.0 * fmean(known), 2), "Percent")  # type: ignore[arg-type]
    return out


def query(timeout: float = TIMEOUT_SECONDS) -> dict[str, tuple[float, str]]:
    """The node's profiling metrics from ``dcgmi`` (the first on ``PATH``)."""
    if shutil.which(COMMAND[0]) is None:
        raise DcgmUnavailable("no dcgmi on PATH (DCGM is not installed on this image)")
    try:
        res = subprocess.run(COMMAND, capture_output=True, text=True, timeout=timeout,
                             check=False)
    except subprocess.TimeoutExpired:
        raise DcgmUnavailable(f"dcgmi dmon did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise DcgmUnavailable(f"dcgmi: {exc}") from None
    metrics = node_metrics(parse(res.stdout))
    if res.returncode != 0 or not metrics:
        detail = [ln for ln in (res.stderr + res.stdout).strip().splitlines()
                  if ln.strip() and not ln.startswith(("#", "ID", "GPU"))]
        raise DcgmUnavailable(f"dcgmi dmon exited {res.returncode} with no profiling value"
                              f"{': ' + detail[0][:200] if detail else ''}")
    return metrics

"""A node's GPU readings from ``nvidia-smi``, and the per-node metrics made of them.

``nvidia-smi --query-gpu=<FIELDS> --format=csv,noheader,nounits`` prints one line per GPU,
the fields in the order asked, comma-separated, without units; a value the GPU does not
report is ``[N/A]`` or ``[Not Supported]`` (NVIDIA's nvidia-smi manual, "--query-gpu";
the field names are ``nvidia-smi --help-query-gpu``'s). The fields (:data:`FIELDS`):
utilisation and memory (the dashboard's and the idle alarm's), temperature and power draw
(a GPU throttling or failing), and the counters that go with XID errors: uncorrected ECC
errors since the driver loaded (``ecc.errors.uncorrected.volatile.total``: XID 48/63/64
class) and whether retired pages wait for a GPU reset (``retired_pages.pending``).

:func:`parse` and :func:`node_metrics` are pure; :func:`query` runs the program (bounded
by a timeout) and raises :class:`GpuQueryError` when there is no answer (no driver, no
program, a hung driver), which the caller logs once and then emits nothing.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from statistics import fmean

from bootstrap_scripts.metrics import metric_names as names

#: The fields asked, in this order (the names ``nvidia-smi --help-query-gpu`` lists).
FIELDS = ("index", "utilization.gpu", "memory.used", "temperature.gpu", "power.draw",
          "ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
COMMAND = ("nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits")
#: Seconds one query may take (a driver in trouble can hang nvidia-smi for minutes).
TIMEOUT_SECONDS = 10.0
#: How nvidia-smi writes a value the GPU does not report.
MISSING = frozenset({"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", ""})


class GpuQueryError(RuntimeError):
    """nvidia-smi gave no usable answer (the message says why)."""


@dataclass(frozen=True)
class GpuReading:
    """One GPU's answer; None where the GPU does not report the field."""

    index: int
    utilization: float | None
    memory_used_mib: float | None
    temperature_c: float | None
    power_w: float | None
    ecc_uncorrected: float | None
    retired_pages_pending: bool | None


def _number(text: str) -> float | None:
    text = text.strip()
    if text in MISSING:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _yes_no(text: str) -> bool | None:
    text = text.strip().lower()
    return True if text == "yes" else False if text == "no" else None


def parse(output: str) -> list[GpuReading]:
    """The readings of ``nvidia-smi``'s CSV answer; GpuQueryError on a line that does not
    have :data:`FIELDS`' count of values or an index that is not a number."""
    readings = []
    for line in output.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(FIELDS) or not values[0].isdigit():
            raise GpuQueryError(f"unexpected nvidia-smi line {line[:200]!r}")
        readings.append(GpuReading(
            index=int(values[0]), utilization=_number(values[1]),
            memory_used_mib=_number(values[2]), temperature_c=_number(values[3]),
            power_w=_number(values[4]), ecc_uncorrected=_number(values[5]),
            retired_pages_pending=_yes_no(values[6])))
    return readings


def node_metrics(readings: list[GpuReading]) -> dict[str, tuple[float, str]]:
    """The node's metrics (``name -> (value, unit)``, ``metrics_emf.render``'s shape): the
    GPUs' mean utilisation, summed memory, power and ECC errors, the hottest temperature,
    the GPUs with retired pages pending. A field no GPU reports is left out."""
    out: dict[str, tuple[float, str]] = {}

    def known(attr: str) -> list[float]:
        return [v for r in readings if (v := getattr(r, attr)) is not None]

    if util := known("utilization"):
        out[names.METRIC_GPU_UTILIZATION] = (round(fmean(util), 2), "Percent")
    if mem := known("memory_used_mib"):
        out[names.METRIC_GPU_MEMORY_USED] = (sum(mem), "Megabytes")
    if temp := known("temperature_c"):
        out[names.METRIC_GPU_TEMPERATURE] = (max(temp), "None")
    if power := known("power_w"):
        out[names.METRIC_GPU_POWER] = (round(sum(power), 2), "None")
    if ecc := known("ecc_uncorrected"):
        out[names.METRIC_GPU_ECC_UNCORRECTED] = (sum(ecc), "Count")
    pending = [r.retired_pages_pending for r in readings if r.retired_pages_pending is not None]
    if pending:
        out[names.METRIC_GPU_RETIRED_PAGES_PENDING] = (float(sum(pending)), "Count")
    return out


def query(timeout: float = TIMEOUT_SECONDS) -> list[GpuReading]:
    """Ask nvidia-smi (the first on ``PATH``) for every GPU's :data:`FIELDS`."""
    try:
        res = subprocess.run(COMMAND, capture_output=True, text=True, timeout=timeout,
                             check=False)
    except FileNotFoundError:
        raise GpuQueryError("no nvidia-smi on PATH") from None
    except subprocess.TimeoutExpired:
        raise GpuQueryError(f"nvidia-smi did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise GpuQueryError(f"nvidia-smi: {exc}") from None
    if res.returncode != 0:
        detail = (res.stderr or res.stdout).strip().splitlines()
        raise GpuQueryError(f"nvidia-smi exited {res.returncode}"
                            f"{': ' + detail[0][:200] if detail else ''}")
    readings = parse(res.stdout)
    if not readings:
        raise GpuQueryError("nvidia-smi listed no GPU")
    return readings

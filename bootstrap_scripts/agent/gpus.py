"""GPU count from the driver (``nvidia-smi -L``), never from an instance-type table.

The original looked the instance type up in a hard-coded list first, so newer types
(p3dn, p4d, ...) reported 0 GPUs. Asking the driver is always right; no driver means 0.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

log = logging.getLogger(__name__)


def count_gpus(nvidia_smi: str = "nvidia-smi", *, timeout: float = 30.0) -> int:
    """Number of ``GPU n:`` lines printed by ``nvidia-smi -L``; 0 when absent or failing."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return 0
    try:
        out = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi failed (%s); assuming 0 GPUs", exc)
        return 0
    if out.returncode != 0:
        log.warning("nvidia-smi -L exited %s: %s; assuming 0 GPUs", out.returncode,
                    out.stderr.strip()[:200])
        return 0
    return parse_nvidia_smi_list(out.stdout)


def parse_nvidia_smi_list(text: str) -> int:
    """Count ``GPU <n>: <name> (UUID: ...)`` lines; MIG sub-device lines are not GPUs."""
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))

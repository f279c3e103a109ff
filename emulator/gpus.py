"""GPUs for emulated nodes: a stand-in ``nvidia-smi`` (the only way the product counts GPUs).

The node agent counts GPUs with ``nvidia-smi -L`` (``bootstrap_scripts.agent.gpus``) and the
health gate (``bootstrap_scripts.ops.node_checks``) asks it whether the driver answers: a
missing or failing driver means 0 GPUs. No GPU is ever used: jobs on emulated nodes run on
CPU. An emulated node gets this script first on its ``PATH``:

- with ``Node(gpus=N)``: N GPUs;
- otherwise, when its instance type has GPUs: as many as EC2 says that type has
  (:func:`instance_type_gpus`, from moto's copy of DescribeInstanceTypes), so a node of a
  GPU type looks like the machine AWS would hand out, and the health gate passes on it;
  a type without GPUs gets no script (like a machine without a driver).

Fault hooks (how the demo's "unhealthy node" and the gate's tests break a node):

- ``Node(gpu_fault=True)``: the script fails from boot, as a broken driver does
  (exit 9, NVIDIA's message on stderr);
- at any time: the file ``<node root>/emulator/gpu-fault`` (:func:`inject_gpu_fault`)
  makes the script fail from then on, until the file is removed; the agent keeps the GPU
  count it registered at boot, the gate's ``nvidia-smi`` check fails on that node;
- ``Node(gpus=N)`` with N below the instance type's count: the gate's ``gpus`` check
  fails on that node ("1 (expected 8)").
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import os
import shlex
import stat
from pathlib import Path

#: Where a node's stand-in driver lives, relative to its root (first on its PATH).
NODE_BIN_DIR = "usr/bin"
#: Relative to a node's root: while this file exists, the node's stand-in nvidia-smi fails.
GPU_FAULT_FILE = "emulator/gpu-fault"
DRIVER_FAILURE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                  "driver. Make sure that the latest NVIDIA driver is installed and running.")


def fake_nvidia_smi(directory: Path, gpus: int, *, fault: bool = False,
                    fault_file: Path | None = None) -> Path:
    """Write ``directory/nvidia-smi`` listing ``gpus`` GPUs (or failing); returns
    ``directory``, to prepend to ``PATH``. ``fault_file`` (default: the node's
    :data:`GPU_FAULT_FILE`, when ``directory`` is its :data:`NODE_BIN_DIR`) makes it fail
    while that file exists."""
    if gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    directory.mkdir(parents=True, exist_ok=True)
    if fault_file is None and directory.as_posix().endswith("/" + NODE_BIN_DIR):
        fault_file = Path(directory.as_posix()[:-len(NODE_BIN_DIR)]) / GPU_FAULT_FILE
    fail = f"echo {shlex.quote(DRIVER_FAILURE)} >&2\nexit 9\n"
    if fault:
        body = fail
    else:
        lines = "".join(f"GPU {g}: Tesla V100-SXM2-16GB (UUID: GPU-{g:08d}-emulated)\\n"
                        for g in range(gpus))
        check = f"if [ -e {shlex.quote(str(fault_file))} ]; then\n{fail}fi\n" \
            if fault_file else ""
        body = f"{check}[ \"$1\" = -L ] || exit 9\nprintf '{lines}'\n"
    script = directory / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def inject_gpu_fault(root: Path, reason: str = "injected by the emulator") -> Path:
    """From now on the stand-in nvidia-smi of the node at ``root`` fails (see the module
    docstring); returns the file, whose removal heals the node."""
    path = root / GPU_FAULT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason + "\n")
    return path


def give_gpus(root: Path, env: dict[str, str], gpus: int, *, fault: bool = False) -> None:
    """Put a stand-in nvidia-smi with ``gpus`` GPUs first on the PATH in ``env`` (a node's
    process environment) — what ``Node(gpus=N)`` does at boot."""
    bindir = fake_nvidia_smi(root / NODE_BIN_DIR, gpus, fault=fault)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"


@functools.cache
def _moto_instance_types() -> dict:
    spec = importlib.util.find_spec("moto")
    if spec is None or not spec.submodule_search_locations:
        return {}
    package = Path(next(iter(spec.submodule_search_locations)))
    data = package / "ec2/resources/instance_types.json.gz"
    try:
        with gzip.open(data, "rt") as fh:
            return json.load(fh)
    except OSError:
        return {}


def instance_type_gpus(instance_type: str) -> int | None:
    """GPUs of ``instance_type`` as the emulated EC2 (moto) describes it: the sum of
    ``GpuInfo.Gpus[].Count``, 0 without GpuInfo, None for a type moto does not know."""
    info = _moto_instance_types().get(instance_type)
    if info is None:
        return None
    return sum(int(g.get("Count", 0)) for g in (info.get("GpuInfo") or {}).get("Gpus", []))

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

Readings: ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` (what the job
executor's GPU metrics ask, ``bootstrap_scripts.metrics.gpu_metrics``) answers one line per GPU in
the order asked, NVML-shaped values of a V100-SXM2-16GB (:data:`QUERY_FIELDS`): an idle GPU
(0 %, 0 MiB used, 35 C, 40 W, no ECC error, no retired page pending) unless the file
``<node root>/emulator/gpu-utilization`` (:func:`set_gpu_utilization`) holds a percent,
which then drives utilisation, memory, temperature and power alike on every GPU (no job
uses a GPU here, so nothing else would). A field it does not know fails the query as
nvidia-smi does (exit 2, ``Field "x" is not a valid field to query.``); another
``--format`` exits 2 too.

DCGM: the GPU DLAMIs ship it, so a node with a stand-in nvidia-smi (and a fault file, as
every emulated node has) also gets a stand-in ``dcgmi`` answering ``dmon`` of the three
profiling fields the GPU sampler asks (``bootstrap_scripts.metrics.dcgm_metrics``), its values a
fixed share of the same utilisation (:data:`DMON_FIELDS`), and ``diag -r 1 --json`` (the
deep health gate's) with every level-1 test passed; both fail with the driver.

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
#: Relative to a node's root: a percent (an integer) the stand-in reports as every GPU's
#: utilisation.
GPU_UTILIZATION_FILE = "emulator/gpu-utilization"
#: The ``--query-gpu`` fields the stand-in answers, and the sh expression of each value
#: (``$g``: the GPU's index, ``$util``: the utilisation in percent).
QUERY_FIELDS = {
    "index": "$g",
    "name": "Tesla V100-SXM2-16GB",
    "uuid": "GPU-$(printf %08d $g)-emulated",
    "utilization.gpu": "$util",
    "utilization.memory": "$((util / 2))",
    "memory.total": "16160",
    "memory.used": "$((util * 120))",
    "temperature.gpu": "$((35 + util * 40 / 100))",
    "power.draw": "$((40 + util * 260 / 100)).00",
    "ecc.errors.uncorrected.volatile.total": "0",
    "ecc.errors.corrected.volatile.total": "0",
    "retired_pages.pending": "No",
}
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
        util_file = shlex.quote(str(Path(str(fault_file).removesuffix(GPU_FAULT_FILE))
                                    / GPU_UTILIZATION_FILE)) if fault_file else "/nonexistent"
        body = f"{check}case \"$1\" in\n-L) printf '{lines}' ;;\n" \
               f"--query-gpu=*) {_query_script(gpus, util_file)} ;;\n*) exit 9 ;;\nesac\n"
    scripts = {"nvidia-smi": body}
    if not fault and fault_file:  # the GPU DLAMIs ship DCGM: its dcgmi beside nvidia-smi
        scripts["dcgmi"] = f"{check}{_dcgmi_script(gpus, util_file)}"
    for name, text in scripts.items():
        script = directory / name
        script.write_text("#!/bin/sh\n" + text)
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


#: The DCGM profiling fields the stand-in ``dcgmi dmon`` answers, and each one's share of
#: the utilisation (per mille per percent): SM active, tensor pipes, memory interface.
DMON_FIELDS = {"1002": ("SMACT", 9), "1004": ("TENSO", 5), "1005": ("DRAMA", 4)}


#: ``dcgmi diag -r 1 --json`` of healthy GPUs (level 1: the deployment checks), in the
#: shape the health gate's parser reads (``bootstrap_scripts.ops.node_checks.parse_dcgm``).
DIAG_PASS = json.dumps({"DCGM GPU Diagnostic": {"test_categories": [{
    "category": "Deployment", "tests": [{"name": n, "results": [{"status": "Pass"}]} for n in (
        "Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks",
        "Persistence Mode", "Environment Variables", "Page Retirement/Row Remap",
        "Graphics Processes", "Inforom")]}]}}, separators=(",", ":"))


def _dcgmi_script(gpus: int, util_file: str) -> str:
    """The sh of ``dcgmi dmon -e <DMON_FIELDS> -c 2 ...``: a header, then two samples, the
    first ``N/A`` as DCGM's first sample often is, the second driven by the utilisation
    file; any other command exits as dcgmi does on a field it does not know."""
    ids = ",".join(DMON_FIELDS)
    header = "#Entity   " + "  ".join(f"{n:<11}" for n, _ in DMON_FIELDS.values())
    values = " ".join(f"$(v {k})" for _, k in DMON_FIELDS.values())
    return (
        f'if [ "$*" = "diag -r 1 --json" ]; then echo \'{DIAG_PASS}\'; exit 0; fi\n'
        f'[ "$1 $2 $3" = "dmon -e {ids}" ] || '
        '{ echo "Error: emulated dcgmi answers only dmon of its fields and diag -r 1" >&2; '
        'exit 255; }\n'
        f"util=$(cat {util_file} 2>/dev/null); case $util in ''|*[!0-9]*) util=0 ;; esac\n"
        '[ "$util" -le 100 ] || util=100\n'
        "v() { x=$((util * $1)); printf '%d.%03d' $((x / 1000)) $((x % 1000)); }\n"
        f"echo '{header}'\necho 'ID'\n"
        f"g=0; while [ $g -lt {gpus} ]; do echo \"GPU $g     N/A N/A N/A\"; g=$((g + 1)); done\n"
        f"g=0; while [ $g -lt {gpus} ]; do echo \"GPU $g     {values}\"; g=$((g + 1)); done\n")


def _query_script(gpus: int, util_file: str) -> str:
    """The sh of a ``--query-gpu`` answer (see the module docstring)."""
    cases = "".join(f"    {field}) v=\"{value}\" ;;\n" for field, value in QUERY_FIELDS.items())
    return (
        '[ "$2" = --format=csv,noheader,nounits ] || '
        '{ echo "emulated nvidia-smi: only --format=csv,noheader,nounits" >&2; exit 2; }\n'
        f"  util=$(cat {util_file} 2>/dev/null); case $util in ''|*[!0-9]*) util=0 ;; esac\n"
        '  [ "$util" -le 100 ] || util=100\n'
        "  fields=$(echo \"${1#--query-gpu=}\" | tr ',' ' ')\n"
        f"  g=0; while [ $g -lt {gpus} ]; do line=; sep=\n"
        "  for f in $fields; do\n"
        f"    case $f in\n{cases}"
        '    *) echo "Field \\"$f\\" is not a valid field to query." >&2; exit 2 ;;\n'
        '    esac; line="$line$sep$v"; sep=", "\n'
        '  done; echo "$line"; g=$((g + 1)); done')


def set_gpu_utilization(root: Path, percent: int) -> Path:
    """From now on the stand-in nvidia-smi of the node at ``root`` reports ``percent``
    (0-100) as every GPU's utilisation (see the module docstring); returns the file."""
    if not 0 <= percent <= 100:
        raise ValueError(f"percent must be 0 to 100, got {percent}")
    path = root / GPU_UTILIZATION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{percent}\n")
    return path


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

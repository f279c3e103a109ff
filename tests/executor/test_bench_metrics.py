"""Benchmark: what the cluster's metrics cost a node, per sample.

- **GPU sampler** (``GpuSampler.sample_once``, the executor's thread every 30 s): a real
  ``nvidia-smi --query-gpu`` process (here the emulator's stand-in, an ``sh`` script
  answering for 8 GPUs: fork, exec, a shell loop; a real nvidia-smi asks the driver over
  NVML instead and takes tens of milliseconds more), its parse, the EMF line and its
  ``O_APPEND`` write. Wall time per sample, and CPU time (this process's plus the child's,
  ``getrusage``) as a share of the 30 s interval.
- **EMF writer** (``metrics_emf.render`` + ``append``, what the controller's lines cost):
  in-process, a line of the controller's shape (3 metrics) and of the sampler's (6).

Figures only (``make bench``); nothing is asserted about time.
"""

from __future__ import annotations

import resource
import statistics
import time

import pytest

from bootstrap_scripts.jobs.executor.gpu_sampler import SAMPLE_SECONDS, GpuSampler
from bootstrap_scripts.metrics import metric_names as names
from bootstrap_scripts.metrics import metrics_emf
from emulator.gpus import NODE_BIN_DIR, fake_nvidia_smi

SAMPLES = 40
LINES = 5000
GPUS = 8


def cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.mark.bench
def test_bench_metrics_cost_per_sample(tmp_path, monkeypatch) -> None:
    root = tmp_path / "node"
    (root / "var/log/dl-cluster").mkdir(parents=True)
    bindir = fake_nvidia_smi(root / NODE_BIN_DIR, GPUS)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    sampler = GpuSampler(root, lambda: ("c-bench", "i-0bench"))
    assert sampler.sample_once(), sampler.last_problem
    walls: list[float] = []
    cpu0 = cpu_seconds()
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        assert sampler.sample_once(), sampler.last_problem
        walls.append(time.perf_counter() - t0)
    cpu = (cpu_seconds() - cpu0) / SAMPLES
    lines = metrics_emf.metrics_log(root).read_text().splitlines()
    assert len(lines) == SAMPLES + 1 and '"GPUUtilization"' in lines[-1]

    path = tmp_path / "emf.log"
    shapes = {
        "controller line (3 metrics)": {names.METRIC_JOBS_RUNNING: (1, "Count"),
                                        names.METRIC_JOB_RESTARTS: (0, "Count"),
                                        names.METRIC_UNHEALTHY_NODES: (0, "Count")},
        "sampler line (6 metrics)": {names.METRIC_GPU_UTILIZATION: (57.5, "Percent"),
                                     names.METRIC_GPU_MEMORY_USED: (9600.0, "Megabytes"),
                                     names.METRIC_GPU_TEMPERATURE: (61.0, "None"),
                                     names.METRIC_GPU_POWER: (1200.5, "None"),
                                     names.METRIC_GPU_ECC_UNCORRECTED: (0.0, "Count"),
                                     names.METRIC_GPU_RETIRED_PAGES_PENDING: (0.0, "Count")}}
    writer: dict[str, float] = {}
    for label, metrics in shapes.items():
        t0 = time.perf_counter()
        for _ in range(LINES):
            line = metrics_emf.render(
                namespace=names.NAMESPACE, dimension_sets=[[names.DIM_CLUSTER]],
                dimensions={names.DIM_CLUSTER: "c-bench"}, metrics=metrics,
                timestamp_ms=int(time.time() * 1000))
            metrics_emf.append(path, [line])
        writer[label] = (time.perf_counter() - t0) / LINES
    print(f"\nGPU sampler, one sample ({GPUS} GPUs, the emulator's stand-in nvidia-smi as a "
          f"real process, {SAMPLES} samples): median {statistics.median(walls) * 1e3:.1f} ms "
          f"wall (min {min(walls) * 1e3:.1f}, max {max(walls) * 1e3:.1f}), "
          f"{cpu * 1e3:.1f} ms CPU = {100 * cpu / SAMPLE_SECONDS:.3f} % of a core at one "
          f"sample every {SAMPLE_SECONDS:g} s")
    for label, seconds in writer.items():
        print(f"EMF writer, render + O_APPEND write of one {label}, {LINES} lines in-process: "
              f"{seconds * 1e6:.0f} us per line")

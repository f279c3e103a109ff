"""Benchmark: dl-run start -> every rank past the torchrun rendezvous, 2 / 4 / 8 emulated nodes.

Prints figures only (``make bench``); no timing assertions. Measured on the machine's 2
cores, where every node's torchrun agent and worker import torch on the same CPUs, so the
figure grows with the node count mostly through that start-up CPU cost.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import ShareStarted
from tests.support.cluster import free_rdzv_port

JOBS = Path(__file__).parent / "jobs"
RESULTS: dict[int, dict[str, float]] = {}


@pytest.mark.bench
@pytest.mark.parametrize("n_nodes", [2, 4, 8])
def test_bench_start_to_rendezvous(emu, n_nodes):
    c = emu(n_nodes)
    c.start_executors()
    t0 = time.time()
    res = c.run("--rdzv-port", free_rdzv_port(c), "--", str(JOBS / "rendezvous.py"), timeout=300)
    t_end = time.time()
    assert res.returncode == 0, res.stdout
    stamps = [float(t) for t in re.findall(r"rendezvous-ok rank=\d+ world_size=\d+ t=([\d.]+)",
                                           res.stdout)]
    assert len(stamps) == n_nodes, res.stdout
    (jdir,) = c.job_dirs()
    acks = [store.read_record(JobPaths(jdir).started(r), ShareStarted).started_at
            for r in range(n_nodes)]
    RESULTS[n_nodes] = {
        "all shares started": max(acks) - t0,
        "all ranks past rendezvous": max(stamps) - t0,
        "job finished (dl-run exit)": t_end - t0,
    }
    print(f"\n[bench] {n_nodes} nodes: " + ", ".join(f"{k} {v:.2f} s"
                                                   for k, v in RESULTS[n_nodes].items()))

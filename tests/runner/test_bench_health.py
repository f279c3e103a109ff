"""Benchmark: how long the health gate takes on 3 and 8 emulated nodes (``make bench``).

Real processes: executor-only emulated nodes (one stand-in GPU each, instance type
g5.xlarge as moto's DescribeInstanceTypes describes it), the node checks as a real job
through the executors, the all-reduce as a real torchrun job (gloo, default 32 MiB x 5).
Prints figures only, no timing assertion. On the machine's 2 cores the all-reduce phase is
dominated by every rank importing torch on the same CPUs.
"""

from __future__ import annotations

import time

import pytest

from bootstrap_scripts.ops.gate import GateSettings, run_gate
from bootstrap_scripts.protocol.membership import build_membership
from emulator.gpus import give_gpus
from tests.conftest import REGION
from tests.support.cluster import CLUSTER_ID, free_rdzv_port

RESULTS: dict[int, dict[str, float]] = {}


@pytest.mark.bench
@pytest.mark.parametrize("n_nodes", [3, 8])
def test_bench_health_gate(emu, n_nodes, moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_REGION", REGION)
    c = emu(n_nodes)
    for node in c.nodes:
        give_gpus(node.root, node.env, 1)
    entries = [{"instance_id": n.instance_id, "address": n.address, "gpus": 1,
                "instance_type": "g5.xlarge"} for n in c.nodes]
    m = build_membership(cluster_id=CLUSTER_ID, generation=1, efs_mount=str(c.efs),
                         master=entries[0], workers=entries[1:])
    for node in c.nodes:
        node.apply(m)
    c.start_executors()
    marks: dict[str, float] = {}
    t0 = time.monotonic()
    report = run_gate(c.master_root, c.efs, m,
                      settings=GateSettings(rdzv_port=int(free_rdzv_port(c))),
                      progress=lambda msg: marks.setdefault(msg.split()[0], time.monotonic()))
    total = time.monotonic() - t0
    assert report.ok, report.to_json()
    RESULTS[n_nodes] = {"node checks": marks["all-reduce"] - marks["node"],
                        "all-reduce": t0 + total - marks["all-reduce"], "whole gate": total}
    busbw = sorted(float(n.cells["allreduce"].value.split()[0]) for n in report.nodes)
    print(f"\n[bench] health gate, {n_nodes} nodes: " + ", ".join(
        f"{k} {v:.2f} s" for k, v in RESULTS[n_nodes].items())
        + f"; all-reduce busbw {busbw[0]:g}..{busbw[-1]:g} GB/s (gloo, loopback)")

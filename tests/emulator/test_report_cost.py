"""The demo report's cost of each managed job (``emulator/demo/report.py``): the controller's
ledger from ``job.json``, in ``demo-report.json`` and the figures table."""

from __future__ import annotations

import time
from types import SimpleNamespace

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import AttemptUsage, ManagedJob, NodeUsage
from bootstrap_scripts.protocol.paths import ClusterPaths
from emulator.demo import report


def test_a_managed_jobs_ledger_is_in_the_report_and_its_figures(tmp_path) -> None:
    paths = ClusterPaths(tmp_path)
    now = time.time()
    nodes = tuple(NodeUsage(instance_id=f"i-{n}", instance_type="g5.xlarge",
                            market="on-demand", usd_per_hour="1.006") for n in range(3))
    rec = ManagedJob(job_id="train-1", state="succeeded", usage=(
        AttemptUsage(attempt=1, started_at=now - 1200, ended_at=now, nodes=nodes),))
    paths.managed("train-1").dir.mkdir(parents=True)
    store.write_record(paths.managed("train-1").record, rec)
    ctx = SimpleNamespace(cluster_paths=paths)
    ledger = report.job_cost(ctx, "train-1")
    assert ledger["usd"] == "1.006" and ledger["node_seconds"] == 3600.0
    assert report.job_cost(ctx, "") is None and report.job_cost(ctx, "missing-1") is None
    figures = dict(report.job_figures({"epochs": [], "final_acc": None, "exit_code": 0,
                                       "cost": ledger}))
    assert figures["cost"] == "1.01 USD (1.000 node-hours)"

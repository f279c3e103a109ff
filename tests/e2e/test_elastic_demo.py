"""``make demo ARGS="--elastic ..."``: workers join and leave a running job through the real
cloud path (moto, the Lambda handler, the agents' generations and drains, the executors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from tests.support.demo import assert_nothing_left, run_demo

pytestmark = pytest.mark.slow
LOG_RE = re.compile(r"^(\d+) (ADDED|REMOVED) (\S+) (\S+)$")


def test_worker_added_then_drained_while_training(tmp_path: Path):
    code, out, report = run_demo(tmp_path, "--elastic", "--add-worker-after", "2",
                                 "--remove-worker-after", "5", "--epochs", "40",
                                 "--require-acc", "0.95")
    assert code == 0, out
    el = report["elastic"]
    assert el["world_sizes"] == [3, 4, 3], el
    join, drain = el["join"], el["drain"]
    assert join["world_size"] == 4 and el["join_latency_s"] > 0
    assert drain["requested_by"] == "master agent" and drain["done_s"] is not None
    assert el["drain_latency_s"] > 0
    assert report["final_acc"] >= 0.95
    steps = [s["step"] for s in el["restarts"]]
    assert steps == sorted(steps), f"a restart went back in training: {steps}"
    # membership.log: the base nodes, then the added node ADDED and REMOVED
    lines = [LOG_RE.match(x) for x in el["membership_log"]]
    assert all(lines), el["membership_log"]
    seqs = [int(m.group(1)) for m in lines]
    assert seqs == sorted(seqs)
    changes = [(m.group(2), m.group(3)) for m in lines]
    assert ("ADDED", join["address"]) in changes and ("REMOVED", join["address"]) in changes
    assert changes.index(("ADDED", join["address"])) < changes.index(("REMOVED", join["address"]))
    # every remaining node's workers file follows the live membership
    work = tmp_path / "work"
    base = [n for n in report["nodes"] if n["status"] != "removed" and n["address"]]
    want = [a for a in report["membership"]["nodes"]] or None
    for n in base:
        workers = NodePaths(n["root"]).workers.read_text().split()
        assert join["address"] not in workers, (n["address"], workers)
        if want:
            assert workers == want
    assert ClusterPaths(work / "efs").drain_done(join["instance_id"]).exists()
    assert_nothing_left(tmp_path, report)


def test_failed_data_preparation_keeps_the_node_out(tmp_path: Path):
    code, out, report = run_demo(tmp_path, "--elastic", "--add-worker-after", "2",
                                 "--fail-data-prep", "--epochs", "25", "--require-acc", "0.95")
    assert code == 0, out
    el = report["elastic"]
    join = el["join"]
    assert el["world_sizes"] == [3], el  # the job never saw the node
    assert "first_step_s" not in join
    assert f"{join['instance_id']}.failed" in el["prepared"]
    assert not any(join["address"] in x for x in el["membership_log"])
    assert report["final_acc"] >= 0.95
    assert_nothing_left(tmp_path, report)

"""End-to-end: ``make demo ARGS="--data"``: the dataset is put in an emulated S3 bucket, the
stack is deployed with ``dataBucket``, ``dl-run --data`` stages it on every node before the
job and the example trains from the staged copy on each node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import StagingReport
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import JobResult
from tests.e2e.test_demo import check_common
from tests.support.demo import assert_nothing_left, run_demo

pytestmark = pytest.mark.slow


def test_demo_stages_the_dataset_from_s3_on_every_node_and_trains_from_it(tmp_path):
    code, out, report = run_demo(tmp_path, "--data", "--workers", "1", "--epochs", "4",
                                 "--require-acc", "0.85")
    assert code == 0, out
    live = check_common(tmp_path, report, 2)
    cluster = ClusterPaths(tmp_path / "work" / "efs")
    (attempt,) = [d for d in cluster.jobs_dir.iterdir()
                  if d.name.startswith("torchrun-") and not d.name.endswith(".stage")]
    staging = store.read_record(cluster.job(attempt.name).staging, StagingReport)
    assert staging is not None and staging.source == "s3://dl-demo-datasets/digits/"
    assert len(staging.nodes) == 2 and all(n.objects == 1 for n in staging.nodes)
    # the staging was a job of its own, before the training job, and it succeeded
    stage_result = store.read_record(cluster.job(attempt.name + ".stage").result, JobResult)
    assert stage_result is not None and stage_result.status == "succeeded"
    roots = {n["address"]: Path(n["root"]) for n in live}
    for node in staging.nodes:
        # each node's copy is on its own disk: the root volume's /var/tmp (no instance store)
        local = roots[node.address] / "var/tmp/dl-data-root/dl-demo-datasets/digits"
        assert node.directory == str(local)
        assert (local / "digits.npz").stat().st_size == node.bytes
        manifest = json.loads((local / ".dl-stage/manifest.json").read_text())
        assert list(manifest["objects"]) == ["digits/digits.npz"]
        logs = "".join(p.read_text() for p in cluster.job(attempt.name).nodes.glob(
            f"{node.rank}*.log"))
        assert f"data: {local}/digits.npz (1797 samples)" in logs
    runner = (tmp_path / "work" / "logs" / "dl-run-1.log").read_text()
    assert "data s3://dl-demo-datasets/digits/ staged on 2 node(s)" in runner
    assert out.count("its ranks trained from it") == 2, out  # the demo's own check, per node
    assert report["final_acc"] >= 0.85
    assert_nothing_left(tmp_path, report)

"""TensorFlow for real: ``dl-run --launcher tf`` trains the TF example with
MultiWorkerMirroredStrategy across three emulated nodes.

Needs ``tensorflow-cpu`` in the interpreter that runs the tests (``make tf-deps``; ``make
test-tf`` installs it and runs this file). Without it the test is skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import JobResult, ShareExit
from tests.conftest import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tf,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="tensorflow-cpu is not installed: make test-tf installs it"),
]

EPOCH_RE = re.compile(r"^\[0 (\S+)\] epoch=(\d+) acc=([\d.]+) .* world_size=(\d+)")
DONE_RE = re.compile(r"^\[(\d) (\S+)\] done rank=(\d) world_size=(\d+) steps=(\d+) "
                     r"weights_checksum=([\d.]+)$")
EPOCHS = 4


def test_tf_job_trains_across_three_nodes_with_multiworker_mirrored_strategy(emu, tmp_path):
    c = emu(3)
    c.start_executors()
    port = free_port(c.membership.master_addr)
    res = c.run("--launcher", "tf", "--tf-port", str(port),  # AWS's command line, as written
                "--", "python", "-m", "bootstrap_scripts.examples.train_digits_tf",
                "--epochs", str(EPOCHS), "--require-acc", "0.9", timeout=420)
    assert res.returncode == 0, res.stdout
    lines = res.stdout.splitlines()

    # The chief (the master, rank 0) trained every epoch with all three workers in sync.
    epochs = [m for m in map(EPOCH_RE.match, lines) if m]
    assert [int(m.group(2)) for m in epochs] == list(range(1, EPOCHS + 1)), res.stdout
    assert {m.group(1) for m in epochs} == {c.membership.master_addr}
    assert {m.group(4) for m in epochs} == {"3"}, res.stdout
    assert float(epochs[-1].group(3)) >= 0.9, res.stdout

    # Every node's worker finished the same steps with the same weights: the gradients
    # crossed the nodes (a worker that trained alone would end with other weights).
    done = {int(m.group(1)): m for m in map(DONE_RE.match, lines) if m}
    assert sorted(done) == [0, 1, 2], res.stdout
    for rank, m in done.items():
        assert m.group(2) == c.addresses[rank] and int(m.group(3)) == rank
        assert m.group(4) == "3"
    assert len({m.group(5) for m in done.values()}) == 1, res.stdout
    assert len({m.group(6) for m in done.values()}) == 1, res.stdout

    # What the launcher published: one worker task per node, master first, TF_CONFIG each.
    (jdir,) = c.job_dirs()
    cluster = {"worker": [f"{a}:{port}" for a in c.addresses]}
    assert json.loads((jdir / "tf_cluster.json").read_text()) == cluster
    spec = JobSpec.from_json(store.read_text(JobPaths(jdir).spec) or "")
    for share in spec.shares:
        (proc,) = share.procs
        assert json.loads(proc.env["TF_CONFIG"]) == {
            "cluster": cluster, "task": {"type": "worker", "index": share.rank}}
        assert store.read_record(JobPaths(jdir).exit(share.rank), ShareExit).returncode == 0
    assert store.read_record(JobPaths(jdir).result, JobResult).status == "succeeded"

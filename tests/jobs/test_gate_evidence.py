"""Evidence before marks (``controller/node_evidence.gate_verdicts``, wired in
``supervise.run_gate``): a node's own failed check names it; a collective (the gate's
all-reduce) that failed on several nodes names none of them; the master is never marked."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootstrap_scripts.jobs.controller.node_evidence import gate_reason, gate_verdicts
from bootstrap_scripts.jobs.controller.supervise import JobSupervisor
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.run_request import RunRequest

MASTER, W1, W2 = ("10.0.0.4", "i-m"), ("10.0.1.5", "i-w1"), ("10.0.1.6", "i-w2")
M = build_membership(cluster_id="c", generation=1, efs_mount="/efs",
                     master={"instance_id": MASTER[1], "address": MASTER[0]},
                     workers=[{"instance_id": W1[1], "address": W1[0]},
                              {"instance_id": W2[1], "address": W2[0]}])
ALLREDUCE = gate_reason("allreduce", "timed out waiting for the peers")
GPUS = gate_reason("gpus", "4 (expected 8)")


def fail(node: tuple[str, str], why: str) -> tuple[str, str, str]:
    return (node[0], node[1], why)


@pytest.mark.parametrize(("failures", "passed", "marked"), [
    # a node's own check names it
    ([fail(W1, GPUS)], 2, {"i-w1"}),
    # the collective failed everywhere (a partition): no node named, none marked
    ([fail(MASTER, ALLREDUCE), fail(W1, ALLREDUCE), fail(W2, ALLREDUCE)], 0, set()),
    # on two workers: a link between them, not a node
    ([fail(W1, ALLREDUCE), fail(W2, ALLREDUCE)], 1, set()),
    # on one node while the others passed: that node's own link
    ([fail(W2, ALLREDUCE)], 2, {"i-w2"}),
    # the collective on every node, one worker's own check too: only that worker
    ([fail(MASTER, ALLREDUCE), fail(W1, ALLREDUCE), fail(W2, GPUS), fail(W2, ALLREDUCE)], 0,
     {"i-w2"}),
    # the master is never marked, not even by a check of its own
    ([fail(MASTER, GPUS)], 2, set()),
    ([fail(MASTER, ALLREDUCE)], 2, set()),
])
def test_only_what_the_evidence_names_is_marked(failures, passed, marked):
    verdicts = gate_verdicts(failures, master_instance=MASTER[1], master_address=MASTER[0],
                             passed=passed)
    assert {v.instance_id for v in verdicts if v.mark} == marked
    assert {v.address for v in verdicts} == {f[0] for f in failures}  # each one said
    assert all(v.note for v in verdicts if not v.mark)


class FakeHealth:
    def __init__(self) -> None:
        self.marked: list[str] = []

    def mark_unhealthy(self, instance_id: str) -> str:
        self.marked.append(instance_id)
        return ""


def test_a_partition_during_the_gate_marks_no_node_and_excludes_none(tmp_path: Path):
    """Every node failed the gate's all-reduce (one link dropped): nothing is marked or
    excluded, the record says why, and the choice starts again (the gate runs again)."""
    req = ManagedRequest(job_id="j", run=RunRequest(job_id="j", command=("true",)),
                         submitted_at=1.0)
    (tmp_path / "managed").mkdir()
    health = FakeHealth()
    sup = JobSupervisor(root=tmp_path, efs=tmp_path, paths=managed.submit(tmp_path, req),
                        request=req, job=ManagedJob(job_id="j", state="restarting"),
                        health=health, tick=lambda: None, stopping=lambda: False,
                        gate=lambda *a: [fail(n, ALLREDUCE) for n in (MASTER, W1, W2)])
    assert sorted(sup.run_gate(M, list(M.nodes))) == sorted([MASTER[0], W1[0], W2[0]])
    assert health.marked == [] and sup.job.excluded == ()
    assert all("names no node" in g or "master" in g for g in sup.job.gate_failures), \
        sup.job.gate_failures

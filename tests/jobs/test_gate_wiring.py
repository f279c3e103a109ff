"""The health gate's verdict in the supervisor (an injected gate: no nodes, no AWS): a
failing node is marked Unhealthy and excluded, and the job does not run on it."""

from __future__ import annotations

from pathlib import Path

from bootstrap_scripts.jobs.controller.supervise import JobSupervisor
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.run_request import RunRequest

M = build_membership(cluster_id="c", generation=1, efs_mount="/efs",
                     master={"instance_id": "i-m", "address": "10.0.0.4"},
                     workers=[{"instance_id": "i-w", "address": "10.0.1.5"}])


class FakeHealth:
    def __init__(self) -> None:
        self.marked: list[str] = []

    def mark_unhealthy(self, instance_id: str) -> str:
        self.marked.append(instance_id)
        return ""


def supervisor(tmp_path: Path, gate) -> tuple[JobSupervisor, FakeHealth]:
    req = ManagedRequest(job_id="j", run=RunRequest(job_id="j", command=("true",)),
                         submitted_at=1.0)
    (tmp_path / "managed").mkdir()
    paths = managed.submit(tmp_path, req)
    health = FakeHealth()
    sup = JobSupervisor(root=tmp_path, efs=tmp_path, paths=paths, request=req,
                        job=ManagedJob(job_id="j", state="queued"), health=health, gate=gate,
                        tick=lambda: None, stopping=lambda: False)
    return sup, health


def test_a_node_failing_the_gate_is_marked_unhealthy_and_excluded(tmp_path):
    seen = []

    def gate(root, efs, m, addresses):
        seen.append(addresses)
        return [("10.0.1.5", "", "gpus: 4 (expected 8)")]

    sup, health = supervisor(tmp_path, gate)
    assert sup.run_gate(M, list(M.nodes)) == ["10.0.1.5"]
    assert seen == [["10.0.0.4", "10.0.1.5"]]
    assert health.marked == ["i-w"]  # the instance id from the membership
    assert sup.job.excluded == ("i-w",)
    assert sup.job.last_failure.startswith("node-unhealthy: 10.0.1.5 (i-w): gpus: 4")
    # kept apart from last_failure, which a later failure overwrites
    assert sup.job.gate_failures == ("10.0.1.5 (i-w): gpus: 4 (expected 8)",)
    assert managed.load_job(sup.paths).gate_failures == sup.job.gate_failures
    assert managed.load_job(sup.paths).excluded == ("i-w",)  # on EFS, for the next controller


def test_a_passing_gate_changes_nothing(tmp_path):
    sup, health = supervisor(tmp_path, lambda *a: [])
    assert sup.run_gate(M, list(M.nodes)) == []
    assert health.marked == [] and sup.job.excluded == ()

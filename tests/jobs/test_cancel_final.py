"""A cancel is final (``controller/supervise.py``): a job cancelled while ``restarting``
never starts another attempt, whether the cancel came before the health gate, while it ran
or while the attempt was being prepared (an injected gate and spawner: no nodes, no AWS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootstrap_scripts.jobs.controller import attempts
from bootstrap_scripts.jobs.controller.supervise import JobSupervisor
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest, RestartRecord
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


def restarting(tmp_path: Path, gate) -> JobSupervisor:
    """A job after attempt 2 failed: ``restarting``, its nodes all ready."""
    req = ManagedRequest(job_id="j", run=RunRequest(job_id="j", command=("true",)),
                         submitted_at=1.0)
    (tmp_path / "managed").mkdir()
    paths = managed.submit(tmp_path, req)
    job = ManagedJob(job_id="j", state="restarting", attempt=2, restarts=1, full_size=2,
                     restart_log=(RestartRecord(attempt=2, at=1.0, kind="hang"),))
    sup = JobSupervisor(root=tmp_path, efs=tmp_path, paths=paths, request=req, job=job,
                        health=FakeHealth(), gate=gate, tick=lambda: None,
                        stopping=lambda: False)
    sup.ready_nodes = lambda: (M, list(M.nodes), False)  # type: ignore[method-assign]
    return sup


@pytest.fixture()
def spawned(monkeypatch) -> list:
    calls: list = []

    def spawn(*args, **kwargs):
        calls.append(args)
        raise AssertionError("an attempt was started after the cancel")

    monkeypatch.setattr(attempts, "spawn", spawn)
    return calls


@pytest.mark.parametrize("when", ["before the gate", "while the gate runs",
                                  "while the attempt is prepared"])
def test_a_cancel_while_restarting_starts_no_attempt(tmp_path, spawned, monkeypatch, when):
    gated: list = []

    def gate(root, efs, m, addresses):
        gated.append(addresses)
        if when == "while the gate runs":
            managed.cancel(tmp_path, "j")
        return []

    sup = restarting(tmp_path, gate)
    if when == "before the gate":
        managed.cancel(tmp_path, "j")
    if when == "while the attempt is prepared":
        real = sup.attempt_membership

        def prepared(*args, **kwargs):
            managed.cancel(tmp_path, "j")
            return real(*args, **kwargs)

        monkeypatch.setattr(sup, "attempt_membership", prepared)
    job = sup.run()
    assert job.state == "cancelled", job
    assert job.attempt == 2 and spawned == []
    assert gated == ([] if when == "before the gate" else [[n.address for n in M.nodes]])
    assert managed.load_job(sup.paths).state == "cancelled"

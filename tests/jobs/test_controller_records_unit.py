"""The controller's signed records (``jobs/engine/controller_records.py``) without KMS: a
local P-256 key plays the membership key (the drills in
tests/security/test_controller_records_signature.py use moto's KMS). KMS unreachable is
retried, never concluded; the heartbeat signs nothing; the breaker signs once per mark."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, utils

from bootstrap_scripts.agent.membership_key import MembershipKeyError
from bootstrap_scripts.jobs.controller import sealed
from bootstrap_scripts.jobs.controller.instance_health import InstanceHealth
from bootstrap_scripts.jobs.engine.controller_records import ControllerSeal, Trust
from bootstrap_scripts.protocol.managed_records import BreakerMarks, IdleStopRecord
from bootstrap_scripts.protocol.membership_signature import ALGORITHM, Signature
from bootstrap_scripts.protocol.paths import ClusterPaths

SCHEME = ec.ECDSA(utils.Prehashed(hashes.SHA256()))


class FakeKms:
    """The membership key: ``down`` makes Sign and the public key's fetch fail."""

    def __init__(self) -> None:
        self.private = ec.generate_private_key(ec.SECP256R1())
        self.down = False
        self.signs = 0

    def sign(self, digest: bytes) -> Signature:
        if self.down:
            raise MembershipKeyError("kms:Sign failed: could not connect")
        self.signs += 1
        return Signature(key="arn:k", algorithm=ALGORITHM,
                         value=self.private.sign(digest, SCHEME))

    def verify(self, digest: bytes, sig: Signature) -> bool:
        if self.down:
            raise MembershipKeyError("kms:GetPublicKey failed: could not connect")
        try:
            self.private.public_key().verify(sig.value, digest, SCHEME)
        except InvalidSignature:
            return False
        return True


@pytest.fixture()
def kms() -> FakeKms:
    return FakeKms()


def record() -> IdleStopRecord:
    return IdleStopRecord(state="stopped", updated_at=1.0, stopped_at=1.0, desired_before=4)


def test_kms_unreachable_writes_unsigned_and_signs_at_the_next_heartbeat(tmp_path: Path, kms):
    seal = ControllerSeal(kms.sign, kms.verify)
    path = ClusterPaths(tmp_path).idle_stop
    kms.down = True
    seal.write(path, record())
    assert path in seal.pending
    kms.down = False
    assert seal.read(path, IdleStopRecord, "idle-stop record").trust is Trust.REFUSED
    seal.retry()  # what the controller's heartbeat does
    assert not seal.pending
    found = seal.read(path, IdleStopRecord, "idle-stop record")
    assert found.trust is Trust.SIGNED and found.record == record()


def test_kms_unreachable_while_checking_is_not_concluded(tmp_path: Path, kms):
    seal = ControllerSeal(kms.sign, kms.verify)
    path = ClusterPaths(tmp_path).idle_stop
    seal.write(path, record())
    seal.write(ClusterPaths(tmp_path).breaker, BreakerMarks(marks=(1.0,), updated_at=1.0))
    book = sealed.BreakerBook(seal, tmp_path, "i-m/1")
    kms.down = True
    assert seal.read(path, IdleStopRecord, "idle-stop record").trust is Trust.UNCHECKED
    assert book.load() == ()  # nothing believed while KMS cannot be asked ...
    kms.down = False
    assert seal.read(path, IdleStopRecord, "idle-stop record").trust is Trust.SIGNED
    assert book.load() == (1.0,)  # ... and what the master signed once it can


def test_the_heartbeat_signs_nothing_and_the_breaker_once_per_mark(tmp_path: Path, kms):
    """The breaker's record is rewritten (signed) only when a mark is added, not at each of
    the controller's once-a-second heartbeats, nor when a mark expires."""
    seal = ControllerSeal(kms.sign, kms.verify)
    book = sealed.BreakerBook(seal, tmp_path, "i-m/1")
    health = InstanceHealth("us-east-1", marks=[time.time() - 30])
    book.save(tuple(health.marks))
    assert kms.signs == 0  # nothing before the predecessor's marks were read
    book.load()
    for _ in range(100):  # 100 heartbeats
        book.save(health.recent_marks())
    assert kms.signs == 1
    health.marks.append(time.time())
    for _ in range(100):
        book.save(health.recent_marks())
    assert kms.signs == 2
    health.marks.pop(0)  # expired: nothing to sign
    book.save(tuple(health.marks))
    assert kms.signs == 2 and seal.signs == 2


def test_retention_moves_the_copy_with_the_job_and_a_reused_id_runs(tmp_path: Path, kms):
    """The signed copy leaves with its job (``archive/managed/<user>/<id>.controller.json``,
    where ``ClusterCostUSD`` still counts it), so a later job of the same id is queued; a
    user's job.json saying the job ended long ago archives nothing the copy says runs."""
    from bootstrap_scripts.jobs.controller import retention
    from bootstrap_scripts.jobs.engine import controller_records, managed, user_dirs
    from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
    from bootstrap_scripts.protocol.run_request import RunRequest

    seal = ControllerSeal(kms.sign, kms.verify)
    ClusterPaths(tmp_path).managed_dir.mkdir(parents=True)

    def job(job_id: str, state: str, user_says: str) -> None:
        req = ManagedRequest(job_id=job_id, run=RunRequest(job_id=job_id, command=("true",)),
                             submitted_at=1.0)
        paths = managed.submit(tmp_path, req)
        old = time.time() - 30 * retention.DAY
        managed.save_job(paths, ManagedJob(job_id=job_id, state=user_says, finished_at=old))
        controller_records.write_job(seal, tmp_path, paths.key, ManagedJob(
            job_id=job_id, state=state, finished_at=old if state == "succeeded" else None))

    user_dirs.own_dir(ClusterPaths(tmp_path).managed_dir)
    job("done-1", "succeeded", "succeeded")
    job("runs-1", "running", "succeeded")  # the user's file lies
    moved = retention.archive_finished(tmp_path, days=7, seal=seal)
    me = user_dirs.own_dir(ClusterPaths(tmp_path).managed_dir).name
    assert moved == [f"managed/{me}/done-1"]
    assert not ClusterPaths(tmp_path).controller_job(f"{me}/done-1").exists()
    archived = ClusterPaths(tmp_path).archived_controller_job(f"{me}/done-1")
    assert seal.read(archived, ManagedJob, "job record").trust is Trust.SIGNED
    # the id again: no copy is left to say it ended, so it is queued
    managed.submit(tmp_path, ManagedRequest(job_id="done-1", run=RunRequest(
        job_id="done-1", command=("true",)), submitted_at=2.0))
    assert [p.key for p, _ in managed.queue(tmp_path, seal=seal)] == [f"{me}/done-1"]

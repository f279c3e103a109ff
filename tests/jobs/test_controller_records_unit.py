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

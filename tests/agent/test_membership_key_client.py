"""The membership key's KMS client is built once per agent, before it is needed.

Built lazily at the first verification, every worker of a forming cluster built its client
(boto3's import and the KMS service model, about 0.2 s of CPU) at the moment generation 1
arrived, all at once: most of the 64-node formation figure. These tests replace boto3's
session with a counting fake, so they need no KMS and no network.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils

from bootstrap_scripts.agent.membership_key import MembershipKey, MembershipKeyError
from bootstrap_scripts.agent.roster import Roster
from bootstrap_scripts.agent.worker import run_worker
from bootstrap_scripts.protocol import membership_signature, state
from bootstrap_scripts.protocol.membership_signature import ALGORITHM
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths

KEY = "arn:aws:kms:us-east-1:123456789012:key/test"


class FakeKms:
    """Signs with a P-256 key of its own as KMS signs a DIGEST, and hands out its public
    half as GetPublicKey does (the nodes check signatures locally with it)."""

    private = ec.generate_private_key(ec.SECP256R1())

    def sign(self, **kw):
        assert kw["MessageType"] == "DIGEST"
        value = self.private.sign(kw["Message"], ec.ECDSA(utils.Prehashed(hashes.SHA256())))
        return {"KeyId": kw["KeyId"], "Signature": value}

    def get_public_key(self, **kw):
        der = self.private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return {"KeyId": kw["KeyId"], "PublicKey": der, "KeySpec": "ECC_NIST_P256",
                "KeyUsage": "SIGN_VERIFY", "SigningAlgorithms": ["ECDSA_SHA_256"]}


class Sessions:
    """Stands in for ``boto3.session.Session``; counts the KMS clients built."""

    def __init__(self) -> None:
        self.credentials: object | None = object()
        self.clients = 0

    def __call__(self, region_name=None):
        outer = self

        class Session:
            def get_credentials(self):
                return outer.credentials

            def client(self, service):
                assert service == "kms"
                outer.clients += 1
                return FakeKms()

        return Session()


@pytest.fixture()
def sessions(monkeypatch) -> Sessions:
    fake = Sessions()
    monkeypatch.setattr(boto3.session, "Session", fake)
    return fake


def test_the_worker_builds_its_kms_client_before_any_membership_exists(sessions, tmp_path):
    cluster = ClusterPaths(tmp_path / "efs")
    stop = threading.Event()
    stop.set()  # the watch loop does not run: only what precedes it
    agent = SimpleNamespace(
        config=SimpleNamespace(membership_key=KEY, region="us-east-1", data_prep="",
                               watch_interval=0.25),
        cluster=cluster, log=logging.getLogger("test-worker"), stop=stop, draining=False,
        identity=SimpleNamespace(instance_id="i-0worker00000000001"))
    assert run_worker(agent) == 0
    assert not cluster.membership.exists()
    assert sessions.clients == 1


def test_a_client_is_not_kept_before_credentials_can_be_found(sessions):
    key = MembershipKey(KEY, "us-east-1")
    sessions.credentials = None  # instance metadata not answering yet
    assert key.prepare(logging.getLogger("test")) is False
    with pytest.raises(MembershipKeyError, match="no credentials yet"):
        key.verify(b"d" * 32, None)
    assert sessions.clients == 0
    sessions.credentials = object()
    assert key.prepare(logging.getLogger("test")) is True
    sig = key.sign(b"d" * 32)
    assert sig.algorithm == ALGORITHM
    assert key.verify(b"d" * 32, sig) and key.verify(b"d" * 32, sig)
    assert sessions.clients == 1  # built once, kept for every later call


def test_the_master_signs_every_generation_with_one_client(sessions, tmp_path: Path):
    efs = tmp_path / "efs"
    ClusterPaths(efs).generations_dir.mkdir(parents=True)
    applied = []
    agent = SimpleNamespace(
        config=SimpleNamespace(membership_key=KEY, region="us-east-1", cluster_id="c",
                               mount_point="/efs"),
        cluster=ClusterPaths(efs), log=logging.getLogger("test-master"), gpus=0,
        paths=NodePaths(tmp_path / "master"),
        identity=SimpleNamespace(instance_id="i-0master000000000001", address="10.0.0.4",
                                 instance_type="p3.2xlarge"),
        current=None, apply=applied.append)
    roster = Roster(agent, aws=None)
    roster.prepare_key()
    worker = {"instance_id": "i-0worker00000000001", "address": "10.0.1.5", "gpus": 0,
              "instance_type": "p3.2xlarge"}
    first = roster.publish([worker], reason="initial")
    second = roster.publish([], reason="membership-change")
    assert [m.generation for m in applied] == [first.generation, second.generation] == [1, 2]
    published = state.read_current(efs)
    assert published.generation == 2
    raw = ClusterPaths(efs).membership.read_text()
    assert membership_signature.check(raw, roster.key.verify) == ""  # signed
    assert sessions.clients == 1

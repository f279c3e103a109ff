"""Every node checks the master's signatures locally, with the membership key's public half.

One ``kms:GetPublicKey`` per agent, at start; then a membership document, a drain request or
a root job is checked with ``cryptography`` (ECDSA over the prehashed SHA-256 digest, what
KMS signs with ``MessageType=DIGEST``), no ``kms:Verify``: 63 of those, answered one after
another, were part of the 64-node formation figure. The signatures here are made by the
emulator's KMS (moto with ``emulator/moto_kms.py``, in this process through ``mock_aws``),
which signs a digest as AWS does; moto alone hashed it again, and no offline check passed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import boto3
import botocore.client
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from moto import mock_aws

from bootstrap_scripts.agent.membership_key import (
    MembershipKey,
    MembershipKeyUnfit,
    offline_verifier,
)
from bootstrap_scripts.agent.worker import apply_from_efs
from bootstrap_scripts.jobs.engine import root_jobs
from bootstrap_scripts.protocol import membership_signature as sig
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from emulator import moto_kms
from tests.conftest import REGION


@pytest.fixture()
def kms(monkeypatch) -> Iterator[SimpleNamespace]:
    """moto's KMS as the emulator plays it, and a record of every KMS operation called."""
    moto_kms.install()
    calls: list[str] = []
    original = botocore.client.BaseClient._make_api_call

    def recording(self, operation, params):
        calls.append(operation)
        return original(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    with mock_aws():
        client = boto3.client("kms", region_name=REGION)
        yield SimpleNamespace(client=client, calls=calls, new_key=lambda spec="ECC_NIST_P256":
                              client.create_key(KeySpec=spec, KeyUsage="SIGN_VERIFY")[
                                  "KeyMetadata"]["Arn"])


def doc(generation: int = 1) -> str:
    return build_membership(cluster_id="c", generation=generation, efs_mount="/efs",
                            master={"instance_id": "i-0master000000000001",
                                    "address": "10.0.0.4"},
                            workers=[{"instance_id": "i-0worker00000000001",
                                      "address": "10.0.1.5"}]).to_json()


def test_a_signature_the_emulators_kms_makes_verifies_offline_as_on_aws(kms):
    """The AWS-documented offline check, written out with cryptography alone: the public
    key from GetPublicKey, ECDSA over the prehashed digest. Fails with moto's own Sign,
    which hashes the digest again."""
    key = kms.new_key()
    digest = hashlib.sha256(b"a membership").digest()
    signature = MembershipKey(key, REGION).sign(digest)
    answer = kms.client.get_public_key(KeyId=key)
    assert (answer["KeySpec"], answer["KeyUsage"], answer["KeyId"]) == (
        "ECC_NIST_P256", "SIGN_VERIFY", key)
    public = serialization.load_der_public_key(answer["PublicKey"])
    public.verify(signature.value, digest, ec.ECDSA(utils.Prehashed(hashes.SHA256())))
    with pytest.raises(InvalidSignature):
        public.verify(signature.value, hashlib.sha256(b"another").digest(),
                      ec.ECDSA(utils.Prehashed(hashes.SHA256())))
    # and KMS's own Verify of a DIGEST agrees with the offline check
    assert kms.client.verify(KeyId=key, Message=digest, MessageType="DIGEST",
                             Signature=signature.value,
                             SigningAlgorithm=sig.ALGORITHM)["SignatureValid"]


def test_the_emulator_refuses_a_digest_of_the_wrong_length_as_kms_does(kms):
    key = kms.new_key()
    with pytest.raises(ClientError) as exc:
        kms.client.sign(KeyId=key, Message=b"x" * 31, MessageType="DIGEST",
                        SigningAlgorithm=sig.ALGORITHM)
    assert exc.value.response["Error"]["Code"] == "ValidationException"


def test_after_one_get_public_key_every_check_is_local(kms):
    key = kms.new_key()
    master, worker = MembershipKey(key, REGION), MembershipKey(key, REGION)
    assert worker.prepare(logging.getLogger("test")) is True
    texts = [sig.signed_text(doc(g), master.sign) for g in (1, 2, 3)]
    kms.calls.clear()
    assert [sig.check(t, worker.verify) for t in texts] == ["", "", ""]
    assert kms.calls == []  # no kms:Verify, no second GetPublicKey


def test_a_tampered_document_or_another_keys_signature_is_refused(kms):
    key, forgers = kms.new_key(), kms.new_key()
    verify = MembershipKey(key, REGION).verify
    signed = json.loads(sig.signed_text(doc(), MembershipKey(key, REGION).sign))
    refused = "the membership's signature is not the master's"
    tampered = signed | {"generation": 7}
    assert sig.check(json.dumps(tampered), verify) == refused
    forged = sig.signed_text(doc(), MembershipKey(forgers, REGION).sign)
    assert sig.check(forged, verify) == refused
    garbled = signed | {sig.FIELD: signed[sig.FIELD] | {"value": "AAAA"}}
    assert sig.check(json.dumps(garbled), verify) == refused
    assert sig.check(json.dumps(signed), verify) == ""


@pytest.mark.parametrize("spec", ["ECC_NIST_P384", "ECC_SECG_P256K1", "RSA_2048"])
def test_a_key_of_another_spec_is_refused_naming_it_and_asked_once(kms, spec):
    key = MembershipKey(kms.new_key(spec), REGION)
    assert key.prepare(logging.getLogger("test")) is False
    kms.calls.clear()
    for _ in range(2):
        with pytest.raises(MembershipKeyUnfit, match=f"KeySpec {spec} / KeyUsage SIGN_VERIFY"):
            key.verify(hashlib.sha256(b"x").digest(), sig.Signature(key.key_id, sig.ALGORITHM,
                                                                  b"0"))
    assert kms.calls == []  # a key's spec never changes: not asked again


def p256_answer(**changes) -> dict:
    der = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return {"KeySpec": "ECC_NIST_P256", "KeyUsage": "SIGN_VERIFY",
            "SigningAlgorithms": ["ECDSA_SHA_256"], "PublicKey": der} | changes


@pytest.mark.parametrize(("changes", "named"), [
    ({"KeyUsage": "ENCRYPT_DECRYPT"}, "KeyUsage ENCRYPT_DECRYPT"),
    ({"SigningAlgorithms": ["ECDSA_SHA_384"]}, "['ECDSA_SHA_384']"),
    ({"KeySpec": None}, "KeySpec None"),
    ({"PublicKey": b"not a key"}, "not a DER public key"),
    ({"PublicKey": ec.generate_private_key(ec.SECP384R1()).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)},
     "not on P-256"),
])
def test_an_answer_that_is_not_a_p256_signing_key_is_refused_by_name(changes, named):
    with pytest.raises(MembershipKeyUnfit) as exc:
        offline_verifier("arn:key", p256_answer(**changes))
    assert named in str(exc.value)


class FlakyKms:
    """GetPublicKey fails (no network) until ``up``; then answers for the key behind it."""

    def __init__(self, real) -> None:
        self.real = real
        self.up = False
        self.asked = 0

    def get_public_key(self, **kw):
        self.asked += 1
        if not self.up:
            raise EndpointConnectionError(endpoint_url="https://kms.us-east-1.amazonaws.com")
        return self.real.get_public_key(**kw)


def test_get_public_key_failing_is_retried_not_concluded(kms, tmp_path: Path):
    key = kms.new_key()
    efs = tmp_path / "efs"
    paths = ClusterPaths(efs)
    paths.membership.parent.mkdir(parents=True)
    paths.membership.write_text(sig.signed_text(doc(), MembershipKey(key, REGION).sign))
    flaky = FlakyKms(kms.client)
    worker_key = MembershipKey(key, REGION, client=flaky)
    applied: list[Membership] = []
    agent = SimpleNamespace(log=logging.getLogger("test-worker"), apply=applied.append)
    assert worker_key.prepare(agent.log) is False  # at start: logged, retried at first use
    assert apply_from_efs(agent, paths, worker_key.verify) is False  # look again next tick
    assert applied == []
    flaky.up = True
    assert apply_from_efs(agent, paths, worker_key.verify) is True
    assert [m.generation for m in applied] == [1]
    assert flaky.asked == 3  # once at start, once per tick until it answered; kept since
    assert apply_from_efs(agent, paths, worker_key.verify) is True
    assert flaky.asked == 3


def test_root_jobs_check_with_the_same_local_verifier(kms, tmp_path: Path, monkeypatch):
    """The executors' and the controller's check of root's files (``root_jobs.verifier``)
    is the membership key's local check: one GetPublicKey, no kms:Verify."""
    key = kms.new_key()
    root = tmp_path / "node"
    (root / root_jobs.KEY_FILE).parent.mkdir(parents=True)
    (root / root_jobs.KEY_FILE).write_text(root_jobs.render_key_file(key))
    monkeypatch.setattr(root_jobs.node_region, "client_region", lambda _root=None: REGION)
    verify = root_jobs.verifier(root)
    text = '{"job_id": "j"}\n'
    signature = MembershipKey(key, REGION).sign(root_jobs.digest(text))
    kms.calls.clear()
    assert verify(root_jobs.digest(text), signature) is True
    assert verify(root_jobs.digest(text + " "), signature) is False
    assert kms.calls == ["GetPublicKey"]

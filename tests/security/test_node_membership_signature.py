"""Drill: workers cannot speak for the master. A membership a worker wrote on EFS (root on
every node can write there) is not applied by the other workers; the master's, signed with
the cluster's KMS key (moto's real server: ``kms:Sign`` on the master; every node checks
locally with the key's public half from ``kms:GetPublicKey``), is.

The worker side is the agent's own code (``worker.apply_from_efs``, then the node files of
``node_files.apply_membership``); before the signature, the forged generation replaced the
node's ``/etc/hosts`` aliases and the master address every job rendezvouses with.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from bootstrap_scripts.agent.membership_key import MembershipKey
from bootstrap_scripts.agent.node_files import apply_membership
from bootstrap_scripts.agent.worker import apply_from_efs
from bootstrap_scripts.protocol import membership_signature as sig
from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from tests.conftest import REGION

WORKER = {"instance_id": "i-0worker00000000001", "address": "10.0.1.5"}


def membership(generation: int, master_addr: str) -> Membership:
    return build_membership(cluster_id="c", generation=generation, efs_mount="/efs",
                            master={"instance_id": "i-0master000000000001",
                                    "address": master_addr}, workers=[WORKER])


def new_key(endpoint: str) -> str:
    kms = boto3.client("kms", endpoint_url=endpoint, region_name=REGION)
    return kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"][
        "Arn"]


class Worker:
    """A worker's agent as ``apply_from_efs`` sees it, applying to a node root of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = logging.getLogger("drill-worker")

    def apply(self, m: Membership) -> bool:
        apply_membership(self.root, m, instance_id=WORKER["instance_id"])
        return True

    def master_addr(self) -> str:
        return Membership.load(NodePaths(self.root).membership).master_addr


@pytest.fixture()
def cluster(tmp_path: Path, moto_reset: str, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    efs = tmp_path / "efs"
    ClusterPaths(efs).generations_dir.mkdir(parents=True)
    key = new_key(moto_reset)
    return SimpleNamespace(efs=efs, paths=ClusterPaths(efs), key=key,
                           master=MembershipKey(key, REGION), endpoint=moto_reset,
                           worker=Worker(tmp_path / "worker"))


def test_a_worker_written_membership_is_not_applied_by_other_workers(cluster):
    c = cluster
    verify = MembershipKey(c.key, REGION).verify  # what a worker's --membership-key gives
    state.publish(c.efs, membership(1, "10.0.0.4"), None, c.master.sign)
    assert apply_from_efs(c.worker, c.paths, verify)
    assert c.worker.master_addr() == "10.0.0.4"  # the master's document: applied

    # root on a worker writes generation 2 naming a master of its choosing: unsigned...
    forged = membership(2, "10.0.1.66")
    c.paths.membership.write_text(forged.to_json())
    assert apply_from_efs(c.worker, c.paths, verify)
    assert c.worker.master_addr() == "10.0.0.4"
    # ... with the master's old signature copied onto it ...
    old = json.loads(c.paths.generation(1).read_text())[sig.FIELD]
    doc = json.loads(forged.to_json()) | {sig.FIELD: old}
    c.paths.membership.write_text(json.dumps(doc))
    assert apply_from_efs(c.worker, c.paths, verify)
    assert c.worker.master_addr() == "10.0.0.4"
    # ... or signed with a key the forger controls, named in the document
    own = MembershipKey(new_key(c.endpoint), REGION)
    c.paths.membership.write_text(sig.signed_text(forged.to_json(), own.sign))
    assert apply_from_efs(c.worker, c.paths, verify)
    assert c.worker.master_addr() == "10.0.0.4"

    # the master's next generation is applied
    state.publish(c.efs, membership(3, "10.0.0.9"), None, c.master.sign)
    assert apply_from_efs(c.worker, c.paths, verify)
    assert c.worker.master_addr() == "10.0.0.9"


def test_without_the_check_the_forgery_would_be_applied(cluster):
    """The drill can fail: the same forged document, applied by a worker that checks no
    signature (no --membership-key), replaces the master address."""
    c = cluster
    state.publish(c.efs, membership(1, "10.0.0.4"), None, c.master.sign)
    c.paths.membership.write_text(membership(2, "10.0.1.66").to_json())
    assert apply_from_efs(c.worker, c.paths, None)
    assert c.worker.master_addr() == "10.0.1.66"


def test_kms_unreachable_is_retried_not_concluded(cluster, monkeypatch):
    c = cluster
    state.publish(c.efs, membership(1, "10.0.0.4"), None, c.master.sign)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens
    verify = MembershipKey(c.key, REGION).verify
    assert apply_from_efs(c.worker, c.paths, verify) is False  # look again next tick
    assert not NodePaths(c.worker.root).membership.exists()


@pytest.mark.parametrize(("mutate", "why"), [
    (lambda d: d.pop(sig.FIELD), "not signed"),
    (lambda d: d[sig.FIELD].update(algorithm="RSASSA_PSS_SHA_256"), "expected ECDSA_SHA_256"),
    (lambda d: d[sig.FIELD].update(value="not base64!"), "malformed"),
    (lambda d: d.update(generation=7), "not the master's"),
])
def test_check_names_why_a_document_is_refused(mutate, why):
    def sign(digest: bytes) -> sig.Signature:
        return sig.Signature("k", sig.ALGORITHM, b"S" + digest)

    def verify(digest: bytes, s: sig.Signature) -> bool:
        return s.value == b"S" + digest

    text = sig.signed_text(membership(1, "10.0.0.4").to_json(), sign)
    assert sig.check(text, verify) == ""
    doc = json.loads(text)
    mutate(doc)
    assert why in sig.check(json.dumps(doc), verify)

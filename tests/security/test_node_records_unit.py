"""The pure checks behind "a worker cannot speak for another node" (the drill is
test_node_records_signature.py): the signature check, the key a node keeps on its disk, and
which key message the master believes."""

from __future__ import annotations

import json
import logging
import os
import threading

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bootstrap_scripts.agent.node_keys_queue import KeyServer
from bootstrap_scripts.node import node_keys
from bootstrap_scripts.protocol import node_signature as nsig
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.records import Registration

NODE, OTHER = "i-0123456789abcdef0", "i-0fedcba9876543210"
ROLE = "AROAWORKERS000000000X"


def keys():
    return {NODE: nsig.new_private_key(), OTHER: nsig.new_private_key()}


def record(iid: str = NODE, gpus: int = 8) -> str:
    return Registration(instance_id=iid, address="10.0.1.5", role="worker", gpus=gpus).to_json()


def check(text: str, ks, *, iid: str = NODE, fields=None) -> str:
    return nsig.check(text, instance_id=iid, what="node registration",
                      key_of=lambda i: ks[i].public_key() if i in ks else None, fields=fields)


def test_only_the_named_nodes_own_signature_over_these_bytes_counts():
    ks = keys()
    own = nsig.signed_record(record(), nsig.signer(ks[NODE], "n"))
    assert check(own, ks, fields={"instance_id": NODE}) == ""
    assert "not signed" in check(record(), ks)
    tampered = json.dumps({**json.loads(own), "gpus": 1})
    assert f"not {NODE}'s own" in check(tampered, ks)
    by_other = nsig.signed_record(record(), nsig.signer(ks[OTHER], "o"))
    assert f"not {NODE}'s own" in check(by_other, ks)
    # the other node's own record put in this node's place: its key is not this one's
    assert f"not {NODE}'s own" in check(nsig.signed_record(record(OTHER),
                                                           nsig.signer(ks[OTHER], "o")), ks)
    # signed by the node, but naming another instance than its place says
    named = nsig.signed_record(record(OTHER), nsig.signer(ks[NODE], "n"))
    assert "its place says" in check(named, ks, fields={"instance_id": NODE})


def test_a_node_whose_key_is_not_learnt_has_no_record():
    ks = keys()
    own = nsig.signed_record(record(), nsig.signer(ks[NODE], "n"))
    assert "no key learnt" in check(own, {})
    assert "names no instance" in check(own, ks, iid="../etc")


def test_only_a_p256_public_key_is_a_nodes_key():
    nsig.load_public(nsig.public_pem(nsig.new_private_key()))
    other_curve = ec.generate_private_key(ec.SECP384R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key(
    ).public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for bad in (other_curve, rsa_pem, b"junk", b"-" * 5000):
        with pytest.raises(nsig.NodeKeyError):
            nsig.load_public(bad)


def test_the_node_key_is_made_once_private_and_never_read_through_a_link(tmp_path):
    paths = NodePaths(tmp_path / "node")
    assert node_keys.signer(paths) is None  # no key yet: the executor writes unsigned
    key = node_keys.load_or_make(paths)
    assert os.stat(paths.node_key).st_mode & 0o777 == 0o600
    assert nsig.public_pem(node_keys.load_or_make(paths)) == nsig.public_pem(key)  # kept
    assert node_keys.NodeSigner(paths).signed(record()) != record()
    os.chmod(paths.node_key, 0o644)  # readable by others: not used
    assert node_keys.signer(paths) is None
    os.chmod(paths.node_key, 0o600)
    target = tmp_path / "elsewhere.pem"
    os.replace(paths.node_key, target)
    os.symlink(target, paths.node_key)
    with pytest.raises(OSError):
        node_keys.load_or_make(paths)


def server(tmp_path) -> tuple[KeyServer, node_keys.KeyBook]:
    book = node_keys.KeyBook(NodePaths(tmp_path / "master"))
    book.open()
    return KeyServer(queue_url="q", worker_role_id=ROLE, sqs=lambda: None, book=book,
                     log=logging.getLogger("test"), stop=threading.Event()), book


def body(iid: str, pem: bytes) -> str:
    return json.dumps({"instance": iid, "public_key": pem.decode()})


def test_the_master_learns_a_key_only_from_the_instance_sqs_names(tmp_path):
    s, book = server(tmp_path)
    pem = nsig.public_pem(nsig.new_private_key())
    assert "not a session of the workers' role" in s.learn(f"AROAOTHER00000000000X:{NODE}",
                                                           body(NODE, pem))
    assert "speaks for itself only" in s.learn(f"{ROLE}:{OTHER}", body(NODE, pem))
    assert "not a PEM public key" in s.learn(f"{ROLE}:{NODE}", body(NODE, b"junk"))
    assert "no key" in s.learn(f"{ROLE}:{NODE}", "not json")
    assert book.key_of(NODE) is None
    assert s.learn(f"{ROLE}:{NODE}", body(NODE, pem)) == ""
    assert nsig.public_pem(book.key_of(NODE)) == pem

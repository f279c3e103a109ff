"""A node's own signature on the records it writes on EFS for the master to read.

Every node mounts EFS as root, so root on any worker can write any file there: another
node's registration (``cluster/nodes/<instance-id>.json``), its job executor heartbeat
(``cluster/executors/<address>.json``) or its drain acknowledgement
(``cluster/drain/<instance-id>.done``). The master must believe each only from the node it
names. So each node signs what it writes with a key pair of its own (ECDSA P-256, made by
its agent at boot, the private half on the node's local disk, root's alone), and the master
checks the signature against the public half it learnt from that instance through AWS, not
through EFS (``bootstrap_scripts.agent.node_keys_queue``: a message whose SQS ``SenderId``
names the instance).

The signed form is the membership's (:mod:`.membership_signature`): the record without its
``signature`` member, as canonical JSON, its SHA-256 signed; ``signature.key`` names the
signing key (``node:<fingerprint>``), for people: the checker uses the key of the node the
record must come from (its path, its address in the membership), never the one the record
names. This module is pure: keys are given as objects or PEM bytes; the files are
:mod:`bootstrap_scripts.node.node_keys`'.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils

from bootstrap_scripts.protocol import membership_signature as msig

#: The curve of every node key (the membership key's, so the one signature form serves).
CURVE = ec.SECP256R1
#: What a node's signature names as its key (for people reading the record).
KEY_PREFIX = "node:"
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{1,17}$")
#: What to do about a node that never sends its key: the master's log and ``dl-health`` say
#: it (a node booted from user data older than node keys signs nothing and sends no key).
NO_KEY_HINT = ("a node sends its key at boot and every 5 minutes: one that never does runs "
               "older user data, replace it: an instance refresh")
#: A public key in PEM is ~180 bytes; anything much longer is not one.
MAX_PUBLIC_PEM = 1024


class NodeKeyError(ValueError):
    """Not a node's public key (wrong form, wrong curve)."""


def new_private_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(CURVE())


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_pem(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> bytes:
    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return public.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, CURVE):
        raise NodeKeyError("not a P-256 private key")
    return key


def load_public(pem: bytes | str) -> ec.EllipticCurvePublicKey:
    """The P-256 public key in ``pem``, or NodeKeyError (a worker sends it: anything else,
    an RSA key, a certificate, junk, is refused)."""
    raw = pem.encode() if isinstance(pem, str) else pem
    if len(raw) > MAX_PUBLIC_PEM:
        raise NodeKeyError(f"a public key of {len(raw)} bytes is not a node's")
    try:
        key = serialization.load_pem_public_key(raw)
    except (ValueError, TypeError) as exc:
        raise NodeKeyError(f"not a PEM public key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, CURVE):
        raise NodeKeyError("not a P-256 public key")
    return key


def signer(key: ec.EllipticCurvePrivateKey, label: str) -> msig.Signer:
    """``sign(digest)`` with the node's private key (the membership's signature form);
    ``label`` (its fingerprint) is what the signature names, for people."""
    name = f"{KEY_PREFIX}{label}"

    def sign(digest: bytes) -> msig.Signature:
        value = key.sign(digest, ec.ECDSA(utils.Prehashed(hashes.SHA256())))
        return msig.Signature(key=name, algorithm=msig.ALGORITHM, value=value)

    return sign


def verifier(public: ec.EllipticCurvePublicKey) -> msig.Verifier:
    def verify(digest: bytes, sig: msig.Signature) -> bool:
        try:
            public.verify(sig.value, digest, ec.ECDSA(utils.Prehashed(hashes.SHA256())))
        except InvalidSignature:
            return False
        return True

    return verify


def signed_record(text: str, sign: msig.Signer | None) -> str:
    """``text`` (a record's JSON) signed, or unchanged without a signer."""
    return msig.signed_text(text, sign) if sign is not None else text


#: ``key_of(instance_id) -> public key or None`` (None: not learnt yet).
KeyLookup = Callable[[str], "ec.EllipticCurvePublicKey | None"]


def check(text: str, *, instance_id: str, key_of: KeyLookup, what: str,
          fields: Mapping[str, object] | None = None) -> str:
    """Why ``text`` (a ``what``) is not ``instance_id``'s own record ("" when it is): no key
    learnt from that instance yet, no signature, a signature that is not that node's key's
    (another node's, or over other bytes), or a named field that does not say what the
    record's place says (``fields``: e.g. its ``instance_id`` or ``address``)."""
    if not INSTANCE_ID.match(instance_id or ""):
        return f"the {what} names no instance ({instance_id!r})"
    public = key_of(instance_id)
    if public is None:
        return (f"no key learnt from {instance_id} yet (the node counts as not registered; "
                f"{NO_KEY_HINT})")
    why = msig.check(text, verifier(public), what)
    if why:
        return why.replace("the master's", f"{instance_id}'s own")
    if fields:
        doc = json.loads(text)
        for name, want in fields.items():
            if doc.get(name) != want:
                return (f"the {what}'s {name} is {doc.get(name)!r}, its place says "
                        f"{want!r}")
    return ""

"""The master's signature on ``cluster/membership.json``: workers apply only what it signed.

Every node mounts EFS as root (the file system gives the node roles ``ClientRootAccess``),
so root on any worker (or a job that reached it) could write ``cluster/membership.json``;
the other workers would then apply that membership (their ``/etc/hosts``, hostfiles, the
rendezvous address of every job). The fix that needs no change to how nodes mount: the
master signs each document it publishes with a KMS key only the master's role may use
(``kms:Sign``), and workers apply a document only once the signature checks out with the
key's public half (``kms:GetPublicKey``, granted to both roles, fetched once per agent; the
check itself is local). A worker can still write the file; it cannot make another worker
believe it.

The signed bytes are the document without its ``signature`` member, as compact JSON with
sorted keys (:func:`signed_bytes`); ``signature`` carries the key, the algorithm and the
signature in base64. This module is pure (no KMS): ``bootstrap_scripts.agent.membership_key``
makes the calls.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bootstrap_scripts.protocol import record_base

#: The member of ``membership.json`` that carries the master's signature.
FIELD = "signature"
ALGORITHM = "ECDSA_SHA_256"


@dataclass(frozen=True)
class Signature:
    key: str  # the KMS key's ARN
    algorithm: str
    value: bytes


#: ``sign(digest) -> Signature`` (the master); ``verify(digest, signature) -> bool``.
Signer = Callable[[bytes], Signature]
Verifier = Callable[[bytes, Signature], bool]


class SignatureError(ValueError):
    """The document is not signed, or not in a form a signature could be checked."""


def signed_bytes(doc: Mapping) -> bytes:
    """What the signature covers: the document without its signature, canonical JSON."""
    body = {k: v for k, v in doc.items() if k != FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def digest(doc: Mapping) -> bytes:
    """SHA-256 of :func:`signed_bytes` (what KMS signs: a message may be up to 4 KiB, a
    membership of many nodes is more)."""
    return hashlib.sha256(signed_bytes(doc)).digest()


def signed_text(text: str, sign: Signer) -> str:
    """``text`` (a membership document, or another record the master alone may write: a
    drain request) with the master's signature added."""
    doc = record_base.loads(text)
    sig = sign(digest(doc))
    doc[FIELD] = {"key": sig.key, "algorithm": sig.algorithm,
                  "value": base64.b64encode(sig.value).decode()}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def signature_of(doc: Mapping, what: str = "membership") -> Signature:
    raw = doc.get(FIELD)
    if not isinstance(raw, Mapping):
        raise SignatureError(f"the {what} is not signed")
    try:
        return Signature(key=str(raw["key"]), algorithm=str(raw["algorithm"]),
                         value=base64.b64decode(str(raw["value"]), validate=True))
    except (KeyError, binascii.Error) as exc:
        raise SignatureError(f"malformed {what} signature: {exc}") from None


def check(text: str, verify: Verifier, what: str = "membership") -> str:
    """Why ``text`` (a ``what``) must not be applied ("" when the master's signature
    holds)."""
    try:
        doc = record_base.loads(text)
        if not isinstance(doc, Mapping):
            return f"the {what} is not a JSON object"
        sig = signature_of(doc, what)
    except (ValueError, SignatureError) as exc:
        return str(exc)
    if sig.algorithm != ALGORITHM:
        return f"{what} signed with {sig.algorithm!r}, expected {ALGORITHM}"
    if not verify(digest(doc), sig):
        return f"the {what}'s signature is not the master's"
    return ""

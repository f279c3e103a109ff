"""The KMS calls behind the membership's signature (``protocol.membership_signature``).

The master signs with ``kms:Sign`` (its role alone may). Every node checks a signature
itself, with the key's public half: it asks ``kms:GetPublicKey`` once, at start, for the key
named in its user data (``--membership-key``), never for the key a document names (a forger
would name their own), and keeps it. ECDSA on P-256 over a SHA-256 digest
(``MessageType=DIGEST``), so the document's size does not matter; a DIGEST signature is an
ECDSA signature over the prehashed digest, which anyone holding the public key can check
without KMS (AWS's "offline verification": GetPublicKey,
https://docs.aws.amazon.com/kms/latest/APIReference/API_GetPublicKey.html; Verify,
https://docs.aws.amazon.com/kms/latest/APIReference/API_Verify.html; offline operations,
https://docs.aws.amazon.com/kms/latest/developerguide/offline-public-key.html). Before, each
check was a ``kms:Verify`` call: 63 of them when generation 1 reached a 64-node cluster,
answered one after another. Only a key GetPublicKey describes as ``ECC_NIST_P256`` /
``SIGN_VERIFY`` signing with ``ECDSA_SHA_256`` is used (:func:`offline_verifier`); any other
is refused by name. What the local check gives up (AWS's "special considerations for
downloading public keys"): KMS's per-check authorization and CloudTrail record, and a
disabled key no longer failing the check. Neither guards anything here: only the master's
role can make a signature, and a document the master signed stays the master's.

Each node builds its KMS client once, at start (:meth:`MembershipKey.prepare`), and keeps
it: building one (importing boto3, loading the KMS service model) costs about 0.2 s of CPU.
Built lazily at the first verification instead, every worker paid it at the same moment,
when generation 1 arrived: 63 workers x 0.2 s on two cores was 4 to 9 s of the 64-node
formation figure. A master that made a new client for every publish paid it on each.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bootstrap_scripts.protocol.membership_signature import (
    ALGORITHM,
    Signature,
    Verifier,
)

if TYPE_CHECKING:
    from bootstrap_scripts.agent.settings import AgentConfig

LOG = logging.getLogger("dl-agent")


#: What GetPublicKey must say of the membership key before a node checks signatures with it.
KEY_SPEC = "ECC_NIST_P256"
KEY_USAGE = "SIGN_VERIFY"
#: A SHA-256 digest's length: ``MessageType=DIGEST`` with ECDSA_SHA_256 signs 32 bytes.
DIGEST_BYTES = 32


class MembershipKeyError(RuntimeError):
    """KMS could not be asked (network, permissions): try again, do not conclude."""


class MembershipKeyUnfit(MembershipKeyError):
    """GetPublicKey describes a key no membership signature can be checked with (another
    spec, usage or algorithm): nothing is applied with it. A key's spec and usage never
    change, so the answer is kept and KMS is not asked again."""


def offline_verifier(key_id: str, answer: Mapping[str, Any]) -> Verifier:
    """A verifier from ``kms:GetPublicKey``'s ``answer`` for ``key_id``: ECDSA with the
    public key over the prehashed SHA-256 digest, which is what KMS signs with
    ``MessageType=DIGEST``. MembershipKeyUnfit, naming what the answer says, unless the key
    is ECC_NIST_P256 / SIGN_VERIFY with ECDSA_SHA_256 and its public key a P-256 point."""
    spec, usage = answer.get("KeySpec"), answer.get("KeyUsage")
    algorithms = list(answer.get("SigningAlgorithms") or [])
    if spec != KEY_SPEC or usage != KEY_USAGE or ALGORITHM not in algorithms:
        raise MembershipKeyUnfit(
            f"membership key {key_id} is KeySpec {spec} / KeyUsage {usage} with signing "
            f"algorithms {algorithms or 'none'}; expected {KEY_SPEC} / {KEY_USAGE} with "
            f"{ALGORITHM}: no signature is checked with it")
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, utils

    try:
        public = serialization.load_der_public_key(bytes(answer["PublicKey"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise MembershipKeyUnfit(f"membership key {key_id}: GetPublicKey's PublicKey is not "
                                 f"a DER public key ({exc})") from None
    if not isinstance(public, ec.EllipticCurvePublicKey) or \
            not isinstance(public.curve, ec.SECP256R1):
        raise MembershipKeyUnfit(f"membership key {key_id}: its public key is not on P-256 "
                                 f"({type(public).__name__})")
    scheme = ec.ECDSA(utils.Prehashed(hashes.SHA256()))

    def verify(digest: bytes, sig: Signature) -> bool:
        """True only when ``sig`` is the key's ECDSA signature over ``digest``."""
        if len(digest) != DIGEST_BYTES:
            return False
        try:
            public.verify(sig.value, digest, scheme)
        except InvalidSignature:
            return False
        return True

    return verify


class MembershipKey:
    def __init__(self, key_id: str, region: str, client: Any = None) -> None:
        self.key_id = key_id
        self.region = region
        self._client = client
        self._verifier: Verifier | None = None
        self._unfit: MembershipKeyUnfit | None = None

    def client(self) -> Any:
        """The KMS client, built on first use and kept. MembershipKeyError when it cannot be
        built yet (the caller retries as for any KMS failure), including while the instance
        role's credentials cannot be found: a client built then would have none for its
        whole life (as ``MasterAws.connect`` says), and never verify anything."""
        if self._client is None:
            try:
                import boto3

                session = boto3.session.Session(region_name=self.region or None)
                found = session.get_credentials() is not None
                client = session.client("kms") if found else None
            except Exception as exc:  # boto3/botocore errors (no region, bad config)
                raise MembershipKeyError(f"no KMS client for {self.key_id}: {exc}") from exc
            if client is None:
                raise MembershipKeyError(f"no credentials yet for kms calls with {self.key_id}")
            self._client = client
        return self._client

    def prepare(self, log: logging.Logger = LOG) -> bool:
        """Build the client and fetch the public key now, before any document needs
        checking, so the first generation costs neither a client nor a KMS call (see the
        module doc). False (logged) when either cannot be had yet: the first use tries
        again (an unfit key is logged as an error, and never used)."""
        try:
            self.public_verifier()
        except MembershipKeyUnfit as exc:
            log.error("event=membership-key-unfit error=%s", exc)
            return False
        except MembershipKeyError as exc:
            log.warning("event=membership-key-not-ready error=%s (retried at first use)", exc)
            return False
        return True

    def public_verifier(self) -> Verifier:
        """The local verifier of this key (:func:`offline_verifier`), from one
        ``kms:GetPublicKey`` kept for the agent's life. MembershipKeyError when KMS could
        not be asked (asked again at the next call); MembershipKeyUnfit, every time, when
        the key is not one membership signatures can be checked with."""
        if self._unfit is not None:
            raise self._unfit
        if self._verifier is None:
            client = self.client()
            try:
                answer = client.get_public_key(KeyId=self.key_id)
            except Exception as exc:  # botocore's errors: not concluded, asked again
                raise MembershipKeyError(
                    f"kms:GetPublicKey of {self.key_id} failed: {exc}") from exc
            try:
                self._verifier = offline_verifier(self.key_id, answer)
            except MembershipKeyUnfit as exc:
                self._unfit = exc
                raise
        return self._verifier

    def sign(self, digest: bytes) -> Signature:
        try:
            res = self.client().sign(KeyId=self.key_id, Message=digest, MessageType="DIGEST",
                                     SigningAlgorithm=ALGORITHM)
        except Exception as exc:  # botocore's errors: the publish fails and is retried
            raise MembershipKeyError(f"kms:Sign with {self.key_id} failed: {exc}") from exc
        return Signature(key=res["KeyId"], algorithm=ALGORITHM, value=res["Signature"])

    def verify(self, digest: bytes, sig: Signature) -> bool:
        """True only when ``sig`` is this key's signature over ``digest``, checked here with
        the key's public half (no KMS call once it is fetched); MembershipKeyError when the
        public key could not be fetched yet (try again, do not conclude)."""
        return self.public_verifier()(digest, sig)


def membership_key(config: AgentConfig) -> MembershipKey | None:
    """``config``'s key (None: no key configured); keep it, and its client, for the whole run."""
    return MembershipKey(config.membership_key, config.region) if config.membership_key \
        else None

"""The KMS calls behind the membership's signature (``protocol.membership_signature``).

The master signs with ``kms:Sign`` (its role alone may); every node verifies with
``kms:Verify`` against the key named in its user data (``--membership-key``), never against
the key a document names: a forger would name their own. ECDSA on P-256 over a SHA-256
digest (``MessageType=DIGEST``), so the document's size does not matter.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from bootstrap_scripts.protocol.membership_signature import (
    ALGORITHM,
    Signature,
    Signer,
    Verifier,
)

if TYPE_CHECKING:
    from bootstrap_scripts.agent.settings import AgentConfig

LOG = logging.getLogger("dl-agent")


class MembershipKeyError(RuntimeError):
    """KMS could not be asked (network, permissions): try again, do not conclude."""


class MembershipKey:
    def __init__(self, key_id: str, region: str, client: Any = None) -> None:
        self.key_id = key_id
        self.region = region
        self._client = client

    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.session.Session(region_name=self.region or None).client("kms")
        return self._client

    def sign(self, digest: bytes) -> Signature:
        try:
            res = self.client().sign(KeyId=self.key_id, Message=digest, MessageType="DIGEST",
                                     SigningAlgorithm=ALGORITHM)
        except Exception as exc:  # botocore's errors: the publish fails and is retried
            raise MembershipKeyError(f"kms:Sign with {self.key_id} failed: {exc}") from exc
        return Signature(key=res["KeyId"], algorithm=ALGORITHM, value=res["Signature"])

    def verify(self, digest: bytes, sig: Signature) -> bool:
        """True only when KMS says the signature is this key's; KMSInvalidSignatureException
        is a clear no; anything else (no network, throttling) raises MembershipKeyError."""
        client = self.client()
        try:
            res = client.verify(KeyId=self.key_id, Message=digest, MessageType="DIGEST",
                                Signature=sig.value, SigningAlgorithm=ALGORITHM)
        except client.exceptions.KMSInvalidSignatureException:
            return False
        except Exception as exc:
            raise MembershipKeyError(f"kms:Verify with {self.key_id} failed: {exc}") from exc
        return bool(res.get("SignatureValid"))


def membership_signer(config: AgentConfig) -> Signer | None:
    """The master's signer for ``config``'s key (None: no key configured, unsigned)."""
    return MembershipKey(config.membership_key, config.region).sign \
        if config.membership_key else None


def membership_verifier(config: AgentConfig) -> Verifier | None:
    """A worker's verifier for ``config``'s key (None: no key configured)."""
    return MembershipKey(config.membership_key, config.region).verify \
        if config.membership_key else None

"""The KMS calls behind the membership's signature (``protocol.membership_signature``).

The master signs with ``kms:Sign`` (its role alone may); every node verifies with
``kms:Verify`` against the key named in its user data (``--membership-key``), never against
the key a document names: a forger would name their own. ECDSA on P-256 over a SHA-256
digest (``MessageType=DIGEST``), so the document's size does not matter.

Each node builds its KMS client once, at start (:meth:`MembershipKey.prepare`), and keeps
it: building one (importing boto3, loading the KMS service model) costs about 0.2 s of CPU.
Built lazily at the first verification instead, every worker paid it at the same moment,
when generation 1 arrived: 63 workers x 0.2 s on two cores was 4 to 9 s of the 64-node
formation figure. A master that made a new client for every publish paid it on each.
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
        """Build the client now, before any document needs checking, so the first
        generation costs a KMS call and no client construction (see the module doc).
        False (logged) when it cannot be built yet: the first use tries again."""
        try:
            self.client()
        except MembershipKeyError as exc:
            log.warning("event=membership-key-not-ready error=%s (retried at first use)", exc)
            return False
        return True

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


def membership_key(config: AgentConfig) -> MembershipKey | None:
    """``config``'s key (None: no key configured); keep it, and its client, for the whole run."""
    return MembershipKey(config.membership_key, config.region) if config.membership_key \
        else None


def membership_signer(config: AgentConfig) -> Signer | None:
    """The master's signer for ``config``'s key (None: no key configured, unsigned). Each
    call builds its own client: callers keep the signer, or use :func:`membership_key`."""
    key = membership_key(config)
    return key.sign if key else None


def membership_verifier(config: AgentConfig) -> Verifier | None:
    """A worker's verifier for ``config``'s key (None: no key configured); as
    :func:`membership_signer`, keep it."""
    key = membership_key(config)
    return key.verify if key else None

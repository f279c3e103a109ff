"""KMS refuses a key policy that names an IAM principal that does not exist, as AWS does
(part of ``emulator.moto_extensions``, which calls :func:`install`).

AWS: "The principals in the key policy must exist and be visible to KMS" (CreateKey's
``Policy`` parameter, https://docs.aws.amazon.com/kms/latest/APIReference/API_CreateKey.html;
the same for PutKeyPolicy,
https://docs.aws.amazon.com/kms/latest/APIReference/API_PutKeyPolicy.html); otherwise the
call fails with ``MalformedPolicyDocumentException`` "Policy contains a statement with one or
more invalid principals". moto 5 stores any policy. Here CreateKey, PutKeyPolicy and
CloudFormation's ``AWS::KMS::Key`` (which calls CreateKey) check every ``Principal.AWS`` ARN
of a role or user in the key's own account against moto's IAM. Principals of other accounts,
account roots (``:root``), service principals and ``*`` are not checked (moto cannot know
other accounts; the others are not IAM identities).

CloudFormation's ``AWS::KMS::Key`` keeps its ``KeySpec`` and ``KeyUsage`` (a signing key
such as the cluster's membership key): moto's handler ignores both and makes a symmetric
encryption key, on which ``Sign`` fails.

And IAM's CreateServiceLinkedRole for a role that already exists answers as AWS does:
``InvalidInput`` "Service role name … has been taken in this account, please try a different
suffix" (moto says ``EntityAlreadyExists``), so a product that tolerates the existing role
is tested against the error AWS really returns
(https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateServiceLinkedRole.html lists
``InvalidInput`` among its errors).

Sign and Verify with ``MessageType=DIGEST`` (the membership key's calls) treat the message as
the digest, as KMS does: "When the value is DIGEST, KMS skips the hashing step in the signing
algorithm", and the digest must be as long as the algorithm's hash
(https://docs.aws.amazon.com/kms/latest/APIReference/API_Sign.html,
https://docs.aws.amazon.com/kms/latest/APIReference/API_Verify.html). moto ignores
``MessageType`` and hashes the digest again, so its signature would not verify with the
key's public half outside KMS (what every node does: AWS's "offline verification"); here an
ECC key signs and verifies the digest as given (ECDSA over the prehashed digest). RSA keys
keep moto's behaviour (the stack makes none). GetPublicKey also answers ``KeySpec`` (moto
answers only the deprecated ``CustomerMasterKeySpec``, which AWS answers with the same value)
and the key's ARN as ``KeyId``, as AWS does
(https://docs.aws.amazon.com/kms/latest/APIReference/API_GetPublicKey.html).
"""

from __future__ import annotations

import contextvars
import json
import re
from typing import Any

_IDENTITY_ARN = re.compile(r"^arn:(?P<partition>[\w-]+):iam::(?P<account>\d{12}):"
                           r"(?P<kind>role|user)(?P<rest>/.+)$")
_INSTALLED = False
#: Set while a Sign or Verify call with ``MessageType=DIGEST`` is answered (this thread's).
_DIGEST: contextvars.ContextVar[bool] = contextvars.ContextVar("kms_digest", default=False)
#: A digest's length for each signing algorithm's hash (ECDSA_SHA_256 -> 32 bytes).
DIGEST_BYTES = {"SHA_256": 32, "SHA_384": 48, "SHA_512": 64}


def policy_principals(policy: Any) -> list[str]:
    """Every ``Principal.AWS`` value of a policy (JSON text or parsed)."""
    if isinstance(policy, str):
        try:
            policy = json.loads(policy)
        except ValueError:
            return []
    if not isinstance(policy, dict):
        return []
    statements = policy.get("Statement") or []
    if isinstance(statements, dict):
        statements = [statements]
    out: list[str] = []
    for statement in statements:
        principal = statement.get("Principal") if isinstance(statement, dict) else None
        if not isinstance(principal, dict):
            continue
        values = principal.get("AWS", [])
        out.extend([values] if isinstance(values, str) else [str(v) for v in values])
    return out


def identity_exists(arn: str, exists: Any) -> bool:
    """``exists(kind, account, arn)``: does that role or user exist? Non-identity principals
    (roots, other forms) count as existing: only roles and users are checked."""
    m = _IDENTITY_ARN.match(arn)
    if not m:
        return True
    return bool(exists(m["kind"], m["account"], arn))


def missing_principals(policy: Any, account_id: str, exists: Any) -> list[str]:
    """The role and user ARNs of ``account_id`` in ``policy`` that ``exists`` does not know."""
    return [arn for arn in policy_principals(policy)
            if (m := _IDENTITY_ARN.match(arn)) and m["account"] == account_id
            and not identity_exists(arn, exists)]


def _moto_exists(kind: str, account: str, arn: str) -> bool:
    from moto.iam.models import iam_backends

    partition = arn.split(":", 2)[1]
    backend = iam_backends[account][partition]
    if kind == "role":
        return any(role.arn == arn for role in backend.get_roles())
    return any(user.arn == arn for user in backend.users.values())


def _refuse_missing(policy: Any, account_id: str) -> None:
    from moto.core.exceptions import JsonRESTError

    missing = missing_principals(policy, account_id, _moto_exists)
    if missing:
        raise JsonRESTError("MalformedPolicyDocumentException",
                            "Policy contains a statement with one or more invalid principals. "
                            f"(emulator: no such IAM identity: {', '.join(missing)})")


def _wrap_create_key(original: Any) -> Any:
    def create_key(self: Any, policy: Any, *args: Any, **kwargs: Any) -> Any:
        if policy:
            _refuse_missing(policy, self.account_id)
        return original(self, policy, *args, **kwargs)

    return create_key


def _wrap_put_key_policy(original: Any) -> Any:
    def put_key_policy(self: Any, key_id: str, policy: str) -> None:
        _refuse_missing(policy, self.account_id)
        return original(self, key_id, policy)

    return put_key_policy


def _wrap_cfn_key(original: Any) -> Any:
    """CloudFormation's ``AWS::KMS::Key``: KMS's refusal fails the resource, and with it the
    stack operation, as a CloudFormation error (AWS rolls the stack back with the reason;
    moto fails the CreateStack / ExecuteChangeSet call with it)."""
    def create_from_cloudformation_json(cls: Any, *args: Any, **kwargs: Any) -> Any:
        from moto.cloudformation.exceptions import ValidationError
        from moto.core.exceptions import JsonRESTError

        try:
            return _asymmetric_key(*args, **kwargs) or original.__func__(cls, *args, **kwargs)
        except JsonRESTError as exc:
            if exc.error_type != "MalformedPolicyDocumentException":
                raise
            raise ValidationError(message=f"Resource handler returned message: "
                                  f"\"{exc.message}\" (HandlerErrorCode: InvalidRequest, "
                                  f"resource {kwargs.get('LogicalId', '')}, AWS::KMS::Key)") \
                from None

    return classmethod(create_from_cloudformation_json)


def _asymmetric_key(_name: str, template: Any, account_id: str, region_name: str,
                    **_kwargs: Any) -> Any:
    """An ``AWS::KMS::Key`` with a ``KeySpec`` / ``KeyUsage`` of its own (a signing key):
    created with them, as CloudFormation does (moto's handler always makes a symmetric
    encryption key); None for the symmetric default, left to moto."""
    from moto.kms.models import kms_backends

    props = template["Properties"]
    spec = props.get("KeySpec", "SYMMETRIC_DEFAULT")
    usage = props.get("KeyUsage", "ENCRYPT_DECRYPT")
    if (spec, usage) == ("SYMMETRIC_DEFAULT", "ENCRYPT_DECRYPT"):
        return None
    policy = props["KeyPolicy"]  # a template's object; KMS keeps the policy as JSON text
    key = kms_backends[account_id][region_name].create_key(
        policy=policy if isinstance(policy, str) else json.dumps(policy),
        key_usage=usage, key_spec=spec,
        description=props.get("Description"), tags=props.get("Tags", []))
    key.key_rotation_status = props.get("EnableKeyRotation", False)
    key.enabled = props.get("Enabled", True)
    return key


def _wrap_create_service_linked_role(original: Any) -> Any:
    def create_service_linked_role(self: Any, service_name: str, description: str,
                                   suffix: str) -> Any:
        from moto.iam.exceptions import EntityAlreadyExists, InvalidInput

        try:
            return original(self, service_name, description, suffix)
        except EntityAlreadyExists as exc:
            name = re.search(r"Role with name (\S+) already exists", str(exc))
            role = name.group(1) if name else service_name
            raise InvalidInput(f"Service role name {role} has been taken in this account, "
                               "please try a different suffix.") from None

    return create_service_linked_role


def digest_length(signing_algorithm: str) -> int | None:
    """The digest length ``signing_algorithm`` takes with ``MessageType=DIGEST`` (None: not
    a SHA-2 algorithm this emulator knows; moto answers it)."""
    return next((n for suffix, n in DIGEST_BYTES.items()
                 if signing_algorithm.endswith(suffix)), None)


def _prehashed(signing_algorithm: str) -> Any:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, utils

    algorithm = {32: hashes.SHA256(), 48: hashes.SHA384(), 64: hashes.SHA512()}[
        digest_length(signing_algorithm) or 32]
    return ec.ECDSA(utils.Prehashed(algorithm))


def _wrap_digest_call(original: Any) -> Any:
    """KmsResponse.sign / verify: with ``MessageType=DIGEST``, refuse a digest of the wrong
    length as KMS does, and have the ECC key skip its hashing step for this call."""
    def call(self: Any) -> str:
        if self._get_param("MessageType") != "DIGEST":
            return original(self)
        from moto.kms.exceptions import ValidationException

        algorithm = str(self._get_param("SigningAlgorithm") or "")
        message = self._get_param("Message") or b""
        length = digest_length(algorithm)
        if length is not None and message and len(message) != length:
            raise ValidationException(f"Digest is invalid length for algorithm {algorithm}.")
        token = _DIGEST.set(True)
        try:
            return original(self)
        finally:
            _DIGEST.reset(token)

    return call


def _wrap_ecdsa_sign(original: Any) -> Any:
    def sign(self: Any, message: bytes, signing_algorithm: str) -> bytes:
        if not _DIGEST.get():
            return original(self, message, signing_algorithm)
        from moto.kms.utils import validate_signing_algorithm

        validate_signing_algorithm(signing_algorithm, self.valid_signing_algorithms)
        return self.private_key.sign(message, _prehashed(signing_algorithm))

    return sign


def _wrap_ecdsa_verify(original: Any) -> Any:
    def verify(self: Any, message: bytes, signature: bytes, signing_algorithm: str) -> bool:
        if not _DIGEST.get():
            return original(self, message, signature, signing_algorithm)
        from cryptography.exceptions import InvalidSignature
        from moto.kms.utils import validate_signing_algorithm

        validate_signing_algorithm(signing_algorithm, self.valid_signing_algorithms)
        try:
            self.private_key.public_key().verify(signature, message,
                                                 _prehashed(signing_algorithm))
        except InvalidSignature:
            return False
        return True

    return verify


def _wrap_get_public_key(original: Any) -> Any:
    """GetPublicKey's answer with ``KeySpec`` and the key's ARN, as AWS answers it."""
    def get_public_key(self: Any) -> str:
        answer = json.loads(original(self))
        answer["KeySpec"] = answer.get("CustomerMasterKeySpec")
        answer["KeyId"] = self.kms_backend.describe_key(self._get_param("KeyId")).arn
        return json.dumps(answer)

    return get_public_key


def install() -> None:
    """Patch moto's KMS and IAM backends in this process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.iam.models import IAMBackend
    from moto.kms.models import Key, KmsBackend
    from moto.kms.responses import KmsResponse
    from moto.kms.utils import ECDSAPrivateKey

    KmsBackend.create_key = _wrap_create_key(KmsBackend.create_key)  # type: ignore[method-assign]
    KmsBackend.put_key_policy = _wrap_put_key_policy(  # type: ignore[method-assign]
        KmsBackend.put_key_policy)
    Key.create_from_cloudformation_json = _wrap_cfn_key(  # type: ignore[method-assign]
        Key.__dict__["create_from_cloudformation_json"])
    IAMBackend.create_service_linked_role = _wrap_create_service_linked_role(  # type: ignore[method-assign]
        IAMBackend.create_service_linked_role)
    KmsResponse.sign = _wrap_digest_call(KmsResponse.sign)  # type: ignore[method-assign]
    KmsResponse.verify = _wrap_digest_call(KmsResponse.verify)  # type: ignore[method-assign]
    KmsResponse.get_public_key = _wrap_get_public_key(  # type: ignore[method-assign]
        KmsResponse.get_public_key)
    ECDSAPrivateKey.sign = _wrap_ecdsa_sign(ECDSAPrivateKey.sign)  # type: ignore[method-assign]
    ECDSAPrivateKey.verify = _wrap_ecdsa_verify(  # type: ignore[method-assign]
        ECDSAPrivateKey.verify)
    _INSTALLED = True

"""A KMS grant for a service-linked role that may be seconds old: a custom resource's Create.

Why it exists: Auto Scaling publishes the cluster's notifications as its service-linked role
``AWSServiceRoleForAutoScaling``, and the topic is encrypted with the cluster's own key, so
that role must be allowed to use the key. On a fresh account the role is created by the
stack itself, seconds before. A key policy naming it races IAM's propagation: KMS refuses a
policy whose principals are not yet "visible to KMS" (CreateKey,
https://docs.aws.amazon.com/kms/latest/APIReference/API_CreateKey.html; IAM is eventually
consistent, https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html#troubleshoot_general_eventual-consistency),
and CloudFormation's ``AWS::KMS::Key`` fails once, with no retry. So the key's policy does not
name the role; the stack's ``Custom::ServiceRoleGrant`` (its ``ServiceRoleGrant`` construct)
gives it the two operations with ``kms:CreateGrant`` instead (the way AWS's Auto Scaling guide
gives its service-linked role a key it does not name,
https://docs.aws.amazon.com/autoscaling/ec2/userguide/key-policy-requirements-EBS-encryption.html),
and that call, unlike the key's creation, is retried here while KMS answers that it does not
know the principal yet (:data:`NOT_YET_VISIBLE`), a bounded time, then fails naming the role.

Create and Update: the grant (``Name`` makes a repeated call return the same grant, so
Lambda's own retry of the invocation adds none), its id the physical id. Delete: revokes it
(a grant or key already gone is not an error).

Permissions (the construct grants them to the function that answers, the capacity
adjuster's): ``kms:CreateGrant`` on the key for exactly this grantee and these operations,
``kms:RevokeGrant`` on the key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

try:  # imported as lambda_src.service_role_grant (tests, installed package)
    from . import cfn_response
except ImportError:  # imported as service_role_grant (Lambda: the asset root is on sys.path)
    import cfn_response  # type: ignore[no-redef]

RESOURCE_TYPE = "Custom::ServiceRoleGrant"
#: What KMS answers while a new principal is not yet visible to it: CreateGrant's
#: ``InvalidArnException`` (seen with roles seconds old), and the key-policy and not-found
#: answers the same propagation gives elsewhere.
NOT_YET_VISIBLE = frozenset({"InvalidArnException", "MalformedPolicyDocumentException",
                             "NotFoundException"})
#: How long the role may take to become visible: inside the answering function's 60 s
#: timeout, with the answer's PUT after it.
DEADLINE_SECONDS = 40.0
#: The first pause between attempts; it doubles, up to :data:`MAX_PAUSE_SECONDS`.
FIRST_PAUSE_SECONDS = 1.0
MAX_PAUSE_SECONDS = 8.0
#: Revoking a grant that is gone already, or on a key being deleted, is done.
GONE = frozenset({"NotFoundException", "KMSInvalidStateException", "InvalidGrantIdException"})


class RoleNotVisible(RuntimeError):
    """KMS still did not accept the grantee when the deadline passed."""


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _properties(event: dict[str, Any]) -> tuple[str, str, list[str], str]:
    props = event.get("ResourceProperties") or {}
    key, grantee = props.get("KeyArn"), props.get("GranteePrincipal")
    operations, name = props.get("Operations"), props.get("GrantName")
    if not (isinstance(key, str) and key and isinstance(grantee, str) and grantee
            and isinstance(operations, list) and operations
            and all(isinstance(o, str) for o in operations)
            and isinstance(name, str) and name):
        raise ValueError("ResourceProperties needs KeyArn, GranteePrincipal, GrantName "
                         f"(strings) and Operations (a list), got {props!r}")
    return key, grantee, operations, name


def create_grant(kms: Any, *, key: str, grantee: str, operations: list[str], name: str,
                 deadline_seconds: float = DEADLINE_SECONDS,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> str:
    """The grant's id, once KMS accepts ``grantee``.

    Retries :data:`NOT_YET_VISIBLE` answers with a doubling pause until ``deadline_seconds``
    have passed, then raises :class:`RoleNotVisible` naming the role; any other error is
    raised at once (a retry would not fix it)."""
    start = clock()
    pause = FIRST_PAUSE_SECONDS
    attempts = 0
    while True:
        attempts += 1
        try:
            answer = kms.create_grant(KeyId=key, GranteePrincipal=grantee,
                                      Operations=operations, Name=name)
            return str(answer["GrantId"])
        except Exception as exc:
            code = _code(exc)
            if code not in NOT_YET_VISIBLE:
                raise
            waited = clock() - start
            if waited + pause > deadline_seconds:
                raise RoleNotVisible(
                    f"KMS did not accept {grantee} as a grantee of {key} after {attempts} "
                    f"attempts in {waited:.0f} s (last answer {code}: {exc}); a role this "
                    f"stack created may take longer to be visible to KMS: deploy again, or "
                    f"check that the role exists (aws iam get-role --role-name "
                    f"{grantee.rsplit('/', 1)[-1]})") from exc
        sleep(pause)
        pause = min(pause * 2, MAX_PAUSE_SECONDS)


def revoke_grant(kms: Any, *, key: str, grant_id: str) -> None:
    """Revoke the grant; one already gone (or on a key being deleted) is fine."""
    try:
        kms.revoke_grant(KeyId=key, GrantId=grant_id)
    except Exception as exc:
        if _code(exc) not in GONE:
            raise


def respond(event: dict[str, Any], kms: Any, *,
            sleep: Callable[[float], None] = time.sleep,
            clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """The response object for one request (its calls made); never raises."""
    kind = event.get("RequestType")
    try:
        key, grantee, operations, name = _properties(event)
        if kind in ("Create", "Update"):
            grant_id = create_grant(kms, key=key, grantee=grantee, operations=operations,
                                    name=name, sleep=sleep, clock=clock)
            answer = cfn_response.body(
                {**event, "PhysicalResourceId": grant_id},
                reason=f"granted {', '.join(operations)} on {key} to {grantee}")
            answer["Data"] = {"GrantId": grant_id}
            return answer
        if kind == "Delete":
            grant_id = str(event.get("PhysicalResourceId", ""))
            if grant_id and not grant_id.endswith("-servicerolegrant"):  # a grant was made
                revoke_grant(kms, key=key, grant_id=grant_id)
            return cfn_response.body(event)
        raise ValueError(f"unknown RequestType {kind!r}")
    except Exception as exc:  # answered, never raised: CloudFormation would wait an hour
        return cfn_response.body(event, "FAILED",
                                 f"{RESOURCE_TYPE} {kind}: {type(exc).__name__}: {exc}")

"""A service-linked role's use of a key, by a grant made once KMS can see the role.

WHY: a key policy that names a role created seconds earlier in the same deploy races IAM's
propagation (KMS: the principals "must exist and be visible to KMS",
https://docs.aws.amazon.com/kms/latest/APIReference/API_CreateKey.html), and CloudFormation's
``AWS::KMS::Key`` does not retry ``MalformedPolicyDocumentException``. On a fresh account
that role is ``AWSServiceRoleForAutoScaling``, created by ``ServiceLinkedRole`` just before.
So the key's policy does not name it; ``Custom::ServiceRoleGrant`` creates a KMS grant for it
and retries, a bounded time, while KMS does not know the role yet
(``lambda_src/service_role_grant.py``). Whatever must not run before the role may use the key
(the topic Auto Scaling publishes to) depends on ``resource``.

A grant, like any KMS change, is eventually consistent ("typically less than a few seconds",
https://docs.aws.amazon.com/kms/latest/developerguide/using-grant-token.html); Auto Scaling's
first notification follows the creation of a group that comes after the topic, the
subscription and the rest of the stack's network.

The function that answers is the capacity adjuster's: its role gains ``kms:CreateGrant`` on
this key for exactly this grantee and these operations, and ``kms:RevokeGrant`` on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import CustomResource, Names
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct, IDependable

from constructs_lib.validation import ConfigError

RESOURCE_TYPE = "Custom::ServiceRoleGrant"
#: What a service needs to publish to a topic encrypted with the key (SNS's server-side
#: encryption, https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html).
PUBLISH_OPERATIONS = ("GenerateDataKey", "Decrypt")
#: KMS's grant operations (CreateGrant's ``Operations``), the ones a grant may name.
GRANT_OPERATIONS = frozenset({
    "Decrypt", "Encrypt", "GenerateDataKey", "GenerateDataKeyWithoutPlaintext",
    "ReEncryptFrom", "ReEncryptTo", "Sign", "Verify", "GetPublicKey", "CreateGrant",
    "RetireGrant", "DescribeKey", "GenerateDataKeyPair",
    "GenerateDataKeyPairWithoutPlaintext", "GenerateMac", "VerifyMac", "DeriveSharedSecret"})


class ServiceRoleGrant(Construct):
    """Lets ``grantee_arn`` use ``key`` for ``operations`` once KMS can see the role."""

    def __init__(self, scope: Construct, construct_id: str, *, key: kms.IKey,
                 grantee_arn: str, function: lambda_.IFunction, role: iam.IRole,
                 operations: Sequence[str] = PUBLISH_OPERATIONS,
                 after: Sequence[IDependable] = ()) -> None:
        """
        :param key: the key the grant is on.
        :param grantee_arn: the role that may use it (a service-linked role's ARN).
        :param function: the function that answers the custom resource.
        :param role: ``function``'s role, which gains the two KMS calls.
        :param operations: the grant's operations.
            :default: ``GenerateDataKey``, ``Decrypt`` (publishing to an encrypted topic)
        :param after: what creates the role (the grant is made after it).
            :default: nothing
        """
        super().__init__(scope, construct_id)
        unknown = sorted(set(operations) - GRANT_OPERATIONS)
        if not operations or unknown:
            raise ConfigError(f"ServiceRoleGrant {construct_id}: operations must be KMS grant "
                              f"operations ({', '.join(sorted(GRANT_OPERATIONS))}), got "
                              f"{list(operations)!r}")
        policy = role.add_to_principal_policy(iam.PolicyStatement(
            sid="GrantTheServiceRoleItsKeyOperations",
            actions=["kms:CreateGrant"], resources=[key.key_arn],
            conditions={"StringEquals": {"kms:GranteePrincipal": grantee_arn},
                        "ForAllValues:StringEquals": {"kms:GrantOperations":
                                                      list(operations)}}))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="RevokeTheServiceRolesGrantAtDeletion",
            actions=["kms:RevokeGrant"], resources=[key.key_arn]))
        self.resource = CustomResource(
            self, "Resource", service_token=function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties={"KeyArn": key.key_arn, "GranteePrincipal": grantee_arn,
                        "Operations": list(operations),
                        # the same name makes a repeated CreateGrant return the same grant
                        "GrantName": Names.unique_id(self)[-64:]})
        if policy.policy_dependable is not None:
            self.resource.node.add_dependency(policy.policy_dependable)
        for dependable in after:
            self.resource.node.add_dependency(dependable)

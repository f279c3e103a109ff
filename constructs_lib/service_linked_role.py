"""Make sure an AWS service's default service-linked role exists before something names it.

WHY: a KMS key policy may name only principals that exist ("The principals in the key policy
must exist and be visible to KMS",
https://docs.aws.amazon.com/kms/latest/APIReference/API_CreateKey.html), and Auto Scaling's
``AWSServiceRoleForAutoScaling`` exists only once the account has had an Auto Scaling group
(Auto Scaling creates it with the first group,
https://docs.aws.amazon.com/autoscaling/ec2/userguide/autoscaling-service-linked-role.html).
On a fresh account the notification topic's key, which names that role, is created before
any group, and the stack fails with ``MalformedPolicyDocumentException``.

``AWS::IAM::ServiceLinkedRole`` cannot be used: on every account that already has the role
it fails with "has been taken in this account", and the role is shared by every group of
the account, so a stack must neither own nor delete it. Instead a custom resource calls
``iam:CreateServiceLinkedRole`` on create and accepts IAM's ``InvalidInput`` answer for a
role that exists (https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateServiceLinkedRole.html);
it does nothing on update or delete. Another ``InvalidInput`` (say, a misspelt service name)
is accepted as well, but then the key that names the role still fails, naming the principal.
"""

from __future__ import annotations

from aws_cdk import Aws, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import custom_resources as cr
from constructs import Construct

AUTO_SCALING_SERVICE = "autoscaling.amazonaws.com"
AUTO_SCALING_ROLE = "AWSServiceRoleForAutoScaling"
#: IAM's error code for "Service role name … has been taken in this account".
ROLE_TAKEN_ERROR = "InvalidInput"


def service_linked_role_arn(service: str, role_name: str) -> str:
    """The ARN of a service's default service-linked role in this stack's account."""
    return f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:role/aws-service-role/{service}/{role_name}"


class ServiceLinkedRole(Construct):
    """Creates a service's default service-linked role unless the account has it already.

    Depend on this construct (``x.node.add_dependency(role)``) from whatever names the role
    in a policy. Nothing is deleted with the stack: the role belongs to the account.
    """

    def __init__(self, scope: Construct, construct_id: str, *, service: str,
                 role_name: str) -> None:
        """
        :param service: the service principal, e.g. ``autoscaling.amazonaws.com``.
        :param role_name: the default role's name, e.g. ``AWSServiceRoleForAutoScaling``.
        """
        super().__init__(scope, construct_id)
        self.role_arn = service_linked_role_arn(service, role_name)
        self.resource = cr.AwsCustomResource(
            self,
            "Create",
            on_create=cr.AwsSdkCall(
                service="IAM",
                action="CreateServiceLinkedRole",
                parameters={"AWSServiceName": service},
                physical_resource_id=cr.PhysicalResourceId.of(role_name),
                ignore_error_codes_matching=ROLE_TAKEN_ERROR,
            ),
            policy=cr.AwsCustomResourcePolicy.from_statements([
                iam.PolicyStatement(
                    actions=["iam:CreateServiceLinkedRole"],
                    resources=[self.role_arn],
                    conditions={"StringEquals": {"iam:AWSServiceName": service}},
                ),
            ]),
            install_latest_aws_sdk=False,
        )


def auto_scaling_service_linked_role(scope: Construct) -> ServiceLinkedRole:
    """The stack's one ``ServiceLinkedRole`` for Auto Scaling (created on first use)."""
    stack = Stack.of(scope)
    construct_id = "AutoScalingServiceLinkedRole"
    existing = stack.node.try_find_child(construct_id)
    if isinstance(existing, ServiceLinkedRole):
        return existing
    return ServiceLinkedRole(stack, construct_id, service=AUTO_SCALING_SERVICE,
                             role_name=AUTO_SCALING_ROLE)

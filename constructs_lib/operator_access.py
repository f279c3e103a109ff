"""OperatorAccess: the managed policy an operator's role needs to run a cluster with ``dlc``.

``dlc`` (docs/dlc.md) reaches a cluster through AWS APIs only; this policy grants exactly
those calls, scoped to one cluster where AWS allows it:

- read the stack (DescribeStacks, DescribeStackEvents, DescribeStackResources) of the stack
  the construct is in, by its exact ARN;
- list the nodes: autoscaling:DescribeAutoScalingGroups and ec2:DescribeInstances (these
  Describe calls have no resource-level permissions, so ``*``);
- run the master's CLIs through SSM Run Command: ssm:SendCommand with the
  ``AWS-RunShellScript`` document, on instances tagged ``dl-cluster:id=<this cluster>`` only
  (``ssm:resourceTag`` condition), and ssm:GetCommandInvocation to read the result;
- Session Manager: ssm:StartSession on the same tagged instances with the default shell
  document (``SSM-SessionManagerRunShell``) and ``AWS-StartPortForwardingSession``;
  ssm:TerminateSession / ssm:ResumeSession on the caller's own sessions only;
- the hourly cost estimate: pricing:GetProducts.

Deploying and destroying the stack (``dlc up`` / ``dlc down``) needs CDK deploy permissions
(the bootstrap roles), which this policy deliberately does not grant: it is for day-2 use.
AWS's pages for each: https://docs.aws.amazon.com/systems-manager/latest/userguide/sysman-rc-setting-up-cmdsec.html
(Run Command by tag), https://docs.aws.amazon.com/systems-manager/latest/userguide/getting-started-restrict-access-examples.html
(Session Manager), https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssystemsmanager.html
(which ssm actions take which resources and conditions).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY

#: The Run Command document dlc uses (AWS-owned: no account in its ARN).
RUN_COMMAND_DOCUMENT = "AWS-RunShellScript"
#: Session documents: the default shell (an account document AWS creates on first use) and
#: port forwarding (AWS-owned).
DEFAULT_SESSION_DOCUMENTS = ("SSM-SessionManagerRunShell", "AWS-StartPortForwardingSession")


class OperatorAccess(Construct):
    """A customer managed policy with what ``dlc`` needs for one cluster (module doc).

    Attach ``policy`` to the operators' role, user or group (``policy.attach_to_role(...)``);
    the stack outputs its ARN as ``OperatorPolicyArn``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_id: str,
        session_documents: Sequence[str] = DEFAULT_SESSION_DOCUMENTS,
        allow_pricing: bool = True,
        managed_policy_name: str | None = None,
    ) -> None:
        """
        :param cluster_id: the ``dl-cluster:id`` tag of the cluster's instances; Run Command
            and sessions are allowed on instances with this tag only.
        :param session_documents: Session Manager documents operators may start sessions
            with (``AWS-…`` documents are AWS-owned, others the account's).
            :default: ``SSM-SessionManagerRunShell`` (``dlc connect``) and
                ``AWS-StartPortForwardingSession`` (``dlc tunnel``)
        :param allow_pricing: grant pricing:GetProducts for ``dlc status``'s cost estimate.
            :default: True
        :param managed_policy_name: a fixed name for the policy.
            :default: a name CloudFormation generates
        """
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.cluster_id = cluster_id
        tagged = {"StringEquals": {f"ssm:resourceTag/{CLUSTER_TAG_KEY}": cluster_id}}
        instances = stack.format_arn(service="ec2", resource="instance", resource_name="*")

        def ssm_document(name: str) -> str:
            return stack.format_arn(service="ssm", resource="document", resource_name=name,
                                    account="" if name.startswith("AWS-") else None)

        def own_sessions(variable: str) -> str:
            return stack.format_arn(service="ssm", resource="session",
                                    resource_name=f"${{{variable}}}-*")

        statements = [
            iam.PolicyStatement(
                sid="ReadTheClusterStack",
                actions=["cloudformation:DescribeStacks", "cloudformation:DescribeStackEvents",
                         "cloudformation:DescribeStackResources"],
                resources=[stack.stack_id]),  # this stack's ARN, its unique id included
            iam.PolicyStatement(
                sid="ListTheClusterNodes",
                actions=["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances"],
                resources=["*"]),  # these Describe APIs support no resource-level permissions
            iam.PolicyStatement(
                sid="RunCommandDocument", actions=["ssm:SendCommand"],
                resources=[ssm_document(RUN_COMMAND_DOCUMENT)]),
            iam.PolicyStatement(
                sid="RunCommandOnThisClusterOnly", actions=["ssm:SendCommand"],
                resources=[instances], conditions=tagged),
            iam.PolicyStatement(
                sid="ReadCommandResults", actions=["ssm:GetCommandInvocation"],
                resources=["*"]),  # no resource-level permissions for this action
            iam.PolicyStatement(
                sid="SessionsOnThisClusterOnly", actions=["ssm:StartSession"],
                resources=[instances], conditions=tagged),
            iam.PolicyStatement(
                sid="SessionDocuments", actions=["ssm:StartSession"],
                resources=[ssm_document(d) for d in session_documents]),
            iam.PolicyStatement(
                sid="OwnSessionsOnly", actions=["ssm:TerminateSession", "ssm:ResumeSession"],
                resources=[own_sessions("aws:username"), own_sessions("aws:userid")]),
        ]
        if allow_pricing:
            statements.append(iam.PolicyStatement(
                sid="PriceListForCostEstimates", actions=["pricing:GetProducts"],
                resources=["*"]))  # the Price List API has no resources
        self.policy = iam.ManagedPolicy(
            self, "Policy", managed_policy_name=managed_policy_name,
            description=f"dlc day-2 operations on cluster {cluster_id} (status, jobs, "
                        "scale, sessions); deploys need CDK deploy permissions",
            statements=statements)

    @property
    def policy_arn(self) -> str:
        return self.policy.managed_policy_arn

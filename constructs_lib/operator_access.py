"""OperatorAccess: the managed policies an operator's role needs to run a cluster with ``dlc``.

``dlc`` (docs/dlc.md) reaches a cluster through AWS APIs only. Operators get exactly the
product, not a root shell (docs/security.md); ``policy`` (the stack's ``OperatorPolicyArn``)
grants:

- read the stack (DescribeStacks, DescribeStackEvents, DescribeStackResources) of the stack
  the construct is in, by its exact ARN;
- list the nodes: autoscaling:DescribeAutoScalingGroups and ec2:DescribeInstances (these
  Describe calls have no resource-level permissions, so ``*``);
- run the product's commands through SSM Run Command: ssm:SendCommand with this cluster's
  own Command document only (``OperatorDocument``: ``dl-run``, ``dl-jobs``, ``dl-health``,
  ``dl-scale`` with validated parameters; ``dl-run`` as a named user, never root), on
  instances tagged ``dl-cluster:id=<this cluster>`` only (``ssm:resourceTag`` condition); never
  ``AWS-RunShellScript``. ssm:GetCommandInvocation reads the result: the Service Authorization
  Reference lists no resource type and no condition key for it, so it can only be granted
  on ``*``; it reads a command's output by its id (a random UUID the caller got from its own
  SendCommand; ListCommands, which would list other operators' ids, is not granted);
- port forwarding (``dlc tunnel``): ssm:StartSession on the same tagged instances with
  ``AWS-StartPortForwardingSession`` only, and the ``ssm:SessionDocumentAccessCheck``
  condition, without which a StartSession that names no document opens the default shell
  (``SSM-SessionManagerRunShell``) although the policy does not grant it;
  ssm:TerminateSession / ssm:ResumeSession on the caller's own sessions only;
- the hourly cost estimate: pricing:GetProducts;
- (added by ``ClusterObservability.grant_read``) reading the cluster's log group:
  logs:DescribeLogStreams, logs:FilterLogEvents, logs:GetLogEvents on that group only.

A shell on the nodes (``dlc connect``: root, through Session Manager) is a separate,
opt-in permission: ``admin_policy`` (the stack's ``AdminSessionPolicyArn``), for the
cluster's administrators only.

Deploying and destroying the stack (``dlc up`` / ``dlc down``) needs CDK deploy permissions
(the bootstrap roles), which neither policy grants: they are for day-2 use.
AWS's pages for each: https://docs.aws.amazon.com/systems-manager/latest/userguide/sysman-rc-setting-up-cmdsec.html
(Run Command by tag), https://docs.aws.amazon.com/systems-manager/latest/userguide/getting-started-restrict-access-examples.html
(Session Manager), https://docs.aws.amazon.com/systems-manager/latest/userguide/getting-started-sessiondocumentaccesscheck.html
(the session document check), https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssystemsmanager.html
(which ssm actions take which resources and conditions).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY
from constructs_lib.operator_document import OperatorDocument

#: Port forwarding (AWS-owned: no account in its ARN), for ``dlc tunnel``.
DEFAULT_TUNNEL_DOCUMENTS = ("AWS-StartPortForwardingSession",)
#: The default interactive shell (an account document AWS creates on first use).
DEFAULT_SHELL_DOCUMENTS = ("SSM-SessionManagerRunShell",)
#: Without it, a StartSession that names no document opens the default shell.
DOCUMENT_ACCESS_CHECK = {"BoolIfExists": {"ssm:SessionDocumentAccessCheck": "true"}}


class OperatorAccess(Construct):
    """The operator policy and the opt-in admin (shell) policy of one cluster (module doc).

    Attach ``policy`` to the operators' role, user or group (``policy.attach_to_role(...)``)
    and ``admin_policy`` only to those who may be root on the nodes; the stack outputs
    their ARNs as ``OperatorPolicyArn`` and ``AdminSessionPolicyArn``. ``document`` is the
    cluster's Command document (``constructs_lib.operator_document``).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_id: str,
        tunnel_documents: Sequence[str] = DEFAULT_TUNNEL_DOCUMENTS,
        shell_documents: Sequence[str] = DEFAULT_SHELL_DOCUMENTS,
        allow_pricing: bool = True,
        managed_policy_name: str | None = None,
    ) -> None:
        """
        :param cluster_id: the ``dl-cluster:id`` tag of the cluster's instances; Run Command
            and sessions are allowed on instances with this tag only.
        :param tunnel_documents: Session Manager documents operators may start sessions
            with (``AWS-…`` documents are AWS-owned, others the account's); none may be a
            shell.
            :default: ``AWS-StartPortForwardingSession`` (``dlc tunnel``)
        :param shell_documents: Session Manager documents of the admin policy (a shell).
            :default: ``SSM-SessionManagerRunShell`` (``dlc connect``)
        :param allow_pricing: grant pricing:GetProducts for ``dlc status``'s cost estimate.
            :default: True
        :param managed_policy_name: a fixed name for the operator policy.
            :default: a name CloudFormation generates
        """
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.cluster_id = cluster_id
        overlap = set(tunnel_documents) & set(shell_documents)
        if overlap:
            raise ValueError(f"OperatorAccess {construct_id}: tunnel_documents "
                             f"{sorted(overlap)} are shell documents (shell_documents): "
                             "operators must not get a shell")
        self.document = OperatorDocument(self, "Document")
        tagged = {"StringEquals": {f"ssm:resourceTag/{CLUSTER_TAG_KEY}": cluster_id}}
        instances = stack.format_arn(service="ec2", resource="instance", resource_name="*")

        def ssm_document(name: str) -> str:
            return stack.format_arn(service="ssm", resource="document", resource_name=name,
                                    account="" if name.startswith("AWS-") else None)

        def own_sessions(variable: str) -> str:
            return stack.format_arn(service="ssm", resource="session",
                                    resource_name=f"${{{variable}}}-*")

        def sessions(kind: str, documents: Sequence[str]) -> list[iam.PolicyStatement]:
            return [
                iam.PolicyStatement(
                    sid=f"{kind}OnThisClusterOnly", actions=["ssm:StartSession"],
                    resources=[instances], conditions={**tagged, **DOCUMENT_ACCESS_CHECK}),
                iam.PolicyStatement(
                    sid=f"{kind}Documents", actions=["ssm:StartSession"],
                    resources=[ssm_document(d) for d in documents]),
                iam.PolicyStatement(
                    sid="OwnSessionsOnly", actions=["ssm:TerminateSession", "ssm:ResumeSession"],
                    resources=[own_sessions("aws:username"), own_sessions("aws:userid")]),
            ]

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
                sid="RunTheClusterDocumentOnly", actions=["ssm:SendCommand"],
                resources=[ssm_document(self.document.document_name)]),
            iam.PolicyStatement(
                sid="RunCommandOnThisClusterOnly", actions=["ssm:SendCommand"],
                resources=[instances], conditions=tagged),
            iam.PolicyStatement(
                sid="ReadCommandResults", actions=["ssm:GetCommandInvocation"],
                resources=["*"]),  # no resource type or condition key for this action
            *sessions("Tunnels", tunnel_documents),
        ]
        if allow_pricing:
            statements.append(iam.PolicyStatement(
                sid="PriceListForCostEstimates", actions=["pricing:GetProducts"],
                resources=["*"]))  # the Price List API has no resources
        self.policy = iam.ManagedPolicy(
            self, "Policy", managed_policy_name=managed_policy_name,
            description=f"dlc day-2 operations on cluster {cluster_id} (status, jobs, "
                        "scale, tunnels; no shell); deploys need CDK deploy permissions",
            statements=statements)
        self.admin_policy = iam.ManagedPolicy(
            self, "AdminSessionPolicy",
            description=f"A root shell on the nodes of cluster {cluster_id} (dlc connect, "
                        "Session Manager); for the cluster's administrators only",
            statements=sessions("Shells", shell_documents))
        CfnOutput(stack, "AdminSessionPolicyArn", value=self.admin_policy.managed_policy_arn,
                  description="Opt-in: a root shell on the nodes (dlc connect); attach to "
                              "administrators only (OperatorPolicyArn has no shell)")

    @property
    def policy_arn(self) -> str:
        return self.policy.managed_policy_arn

    @property
    def admin_policy_arn(self) -> str:
        return self.admin_policy.managed_policy_arn

    @property
    def document_name(self) -> str:
        """The cluster's Command document (the name CloudFormation generated)."""
        return self.document.document_name

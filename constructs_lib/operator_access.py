"""OperatorAccess: the managed policies an operator's role needs to run a cluster with ``dlc``.

``dlc`` (docs/dlc.md) reaches a cluster through AWS APIs only. Operators get exactly the
product, not a root shell (docs/security.md); ``policy`` (the stack's ``OperatorPolicyArn``)
grants:

- read the stack (DescribeStacks, DescribeStackEvents, DescribeStackResources) of the stack
  the construct is in, by its exact ARN;
- list the nodes: autoscaling:DescribeAutoScalingGroups and ec2:DescribeInstances (these
  Describe calls have no resource-level permissions, so ``*``);
- run the product's commands through SSM Run Command: ssm:SendCommand with the caller's own
  per-user Command document only (``OperatorDocument``: ``dl-run``, ``dl-jobs``,
  ``dl-health``, ``dl-scale`` with validated parameters; ``dl-run`` as that document's user,
  never root), on instances tagged ``dl-cluster:id=<this cluster>`` only (``ssm:resourceTag``
  condition); never ``AWS-RunShellScript``. The document is named by a policy variable,
  ``document/dl-op.<cluster id>.${aws:PrincipalTag/dl-user}``: IAM puts the caller's own
  ``dl-user`` tag (an IAM user's or role's tag, or a session tag) into the ARN when it
  evaluates the request, so one policy serves every operator and each runs only the document
  of their own cluster user; a principal without the tag matches no document (AWS: a
  variable with no value makes its statement match nothing). SendCommand has no condition
  key on a document's parameter values, which is why the user is the document's, not a
  parameter's. Whoever may set that tag (iam:TagUser, iam:TagRole, sts:TagSession on the
  operators' role) chooses the user: only administrators may.
  ssm:GetCommandInvocation reads the result: the Service Authorization Reference lists no
  resource type and no condition key for it, so it can only be granted on ``*``; it reads
  a command's output by its id (a random UUID the caller got from its own SendCommand;
  ListCommands, which would list other operators' ids, is not granted);
- port forwarding (``dlc tunnel``): ssm:StartSession on the same tagged instances with
  ``AWS-StartPortForwardingSession`` only, and the ``ssm:SessionDocumentAccessCheck``
  condition, without which a StartSession that names no document opens the default shell
  (``SSM-SessionManagerRunShell``) although the policy does not grant it;
  ssm:TerminateSession / ssm:ResumeSession on the caller's own sessions only;
- the hourly cost estimate: pricing:GetProducts, and whether the cluster's cost tag is
  active in Billing: ce:ListCostAllocationTags;
- (added by ``ClusterObservability.grant_read``) reading the cluster's log group:
  logs:DescribeLogStreams, logs:FilterLogEvents, logs:GetLogEvents on that group only.

A shell on the nodes (``dlc connect``: root, through Session Manager) is a separate,
opt-in permission: ``admin_policy`` (the stack's ``AdminSessionPolicyArn``), for the
cluster's administrators only. It also runs the any-user Command document (``dlc submit
--as`` any cluster user, ``dl-jobs cancel`` of any job): nothing a root shell could not do.

Deploying and destroying the stack (``dlc up`` / ``dlc down``) needs CDK deploy permissions
(the bootstrap roles), which neither policy grants: they are for day-2 use.
AWS's pages for each: https://docs.aws.amazon.com/systems-manager/latest/userguide/sysman-rc-setting-up-cmdsec.html
(Run Command by tag), https://docs.aws.amazon.com/systems-manager/latest/userguide/getting-started-restrict-access-examples.html
(Session Manager), https://docs.aws.amazon.com/systems-manager/latest/userguide/getting-started-sessiondocumentaccesscheck.html
(the session document check), https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssystemsmanager.html
(which ssm actions take which resources and conditions; SendCommand's document is a
resource, its parameters have no condition key),
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html (tags as
policy variables in a Resource, and a variable with no value),
https://docs.aws.amazon.com/IAM/latest/UserGuide/id_session-tags.html (session tags, and
sts:TagSession that lets a caller set them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aws_cdk import CfnOutput, Stack, Token
from aws_cdk import aws_iam as iam
from constructs import Construct

from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY
from constructs_lib.operator_document import (
    CLUSTER_ID_PATTERN,
    MAX_DOCUMENT_NAME,
    OperatorDocument,
    check_cluster_user,
    user_document_name,
)

#: Port forwarding (AWS-owned: no account in its ARN), for ``dlc tunnel``.
DEFAULT_TUNNEL_DOCUMENTS = ("AWS-StartPortForwardingSession",)
#: The default interactive shell (an account document AWS creates on first use).
DEFAULT_SHELL_DOCUMENTS = ("SSM-SessionManagerRunShell",)
#: Without it, a StartSession that names no document opens the default shell.
DOCUMENT_ACCESS_CHECK = {"BoolIfExists": {"ssm:SessionDocumentAccessCheck": "true"}}
#: The principal tag that names an operator's cluster user (the job role's session tag has
#: the same key and meaning: ``constructs_lib/job_role.py``).
DEFAULT_USER_TAG = "dl-user"


class OperatorAccess(Construct):
    """The operator policy and the opt-in admin (shell) policy of one cluster (module doc).

    Attach ``policy`` to the operators' role, user or group (``policy.attach_to_role(...)``)
    and tag each operator ``dl-user=<their cluster user>``; attach ``admin_policy`` only to
    those who may be root on the nodes; the stack outputs their ARNs as ``OperatorPolicyArn``
    and ``AdminSessionPolicyArn``. ``document`` is the any-user Command document,
    ``user_documents`` the per-user ones by user (``constructs_lib.operator_document``).
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
        cluster_users: Sequence[str] = (),
        user_tag: str = DEFAULT_USER_TAG,
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
        :param allow_pricing: grant pricing:GetProducts and ce:ListCostAllocationTags for
            ``dlc status``'s cost estimate and its cost tag's status.
            :default: True
        :param managed_policy_name: a fixed name for the operator policy.
            :default: a name CloudFormation generates
        :param cluster_users: the Linux users jobs run as (every node has them): one
            per-user Command document each, named ``dl-op.<cluster_id>.<user>``.
            :default: none: operators run nothing until the cluster's users are listed
            (the admin policy's any-user document still runs)
        :param user_tag: the principal tag whose value is an operator's cluster user; the
            operator policy allows the per-user document that the tag names.
            :default: ``dl-user``
        """
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.cluster_id = cluster_id
        overlap = set(tunnel_documents) & set(shell_documents)
        if overlap:
            raise ValueError(f"OperatorAccess {construct_id}: tunnel_documents "
                             f"{sorted(overlap)} are shell documents (shell_documents): "
                             "operators must not get a shell")
        self.user_tag = user_tag
        self.document = OperatorDocument(self, "Document")
        self.user_documents = self._user_documents(construct_id, cluster_id, cluster_users)
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

        run_on_instances = iam.PolicyStatement(
            sid="RunCommandOnThisClusterOnly", actions=["ssm:SendCommand"],
            resources=[instances], conditions=tagged)
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
                sid="RunOwnUsersDocumentOnly", actions=["ssm:SendCommand"],
                resources=[ssm_document(user_document_name(
                    cluster_id, f"${{aws:PrincipalTag/{user_tag}}}"))]),
            run_on_instances,
            iam.PolicyStatement(
                sid="ReadCommandResults", actions=["ssm:GetCommandInvocation"],
                resources=["*"]),  # no resource type or condition key for this action
            *sessions("Tunnels", tunnel_documents),
        ]
        if allow_pricing:
            statements.append(iam.PolicyStatement(
                sid="PriceListForCostEstimates", actions=["pricing:GetProducts"],
                resources=["*"]))  # the Price List API has no resources
            statements.append(iam.PolicyStatement(  # whether the cost tag counts in Billing
                sid="CostTagStatus", actions=["ce:ListCostAllocationTags"],
                resources=["*"]))  # Cost Explorer's tag list has no resource type
        self.policy = iam.ManagedPolicy(
            self, "Policy", managed_policy_name=managed_policy_name,
            description=f"dlc day-2 operations on cluster {cluster_id} (status, jobs, "
                        "scale, tunnels; no shell); deploys need CDK deploy permissions",
            statements=statements)
        self.admin_policy = iam.ManagedPolicy(
            self, "AdminSessionPolicy",
            description=f"A root shell on the nodes of cluster {cluster_id} (dlc connect, "
                        "Session Manager) and jobs as any cluster user (dlc submit --as); "
                        "for the cluster's administrators only",
            statements=[*sessions("Shells", shell_documents),
                        iam.PolicyStatement(
                            sid="RunTheAnyUserDocument", actions=["ssm:SendCommand"],
                            resources=[ssm_document(self.document.document_name)]),
                        run_on_instances])
        CfnOutput(stack, "AdminSessionPolicyArn", value=self.admin_policy.managed_policy_arn,
                  description="Opt-in: a root shell on the nodes (dlc connect) and jobs as "
                              "any cluster user; attach to administrators only "
                              "(OperatorPolicyArn has no shell)")

    def _user_documents(self, construct_id: str, cluster_id: str,
                        users: Sequence[str]) -> dict[str, OperatorDocument]:
        """One per-user document per cluster user, named as the operator policy allows."""
        if not Token.is_unresolved(cluster_id) and not re.fullmatch(CLUSTER_ID_PATTERN,
                                                                     cluster_id):
            raise ValueError(f"OperatorAccess {construct_id}: cluster_id {cluster_id!r} may "
                             "hold letters, digits, _ and - only (it is part of the per-user "
                             "Command documents' names)")
        out: dict[str, OperatorDocument] = {}
        for user in users:
            try:
                check_cluster_user(user)
            except ValueError as exc:
                raise ValueError(f"OperatorAccess {construct_id}: cluster_users: {exc}") from None
            if user in out:
                raise ValueError(f"OperatorAccess {construct_id}: cluster_users names {user!r} "
                                 "twice")
            name = user_document_name(cluster_id, user)
            if not Token.is_unresolved(name) and len(name) > MAX_DOCUMENT_NAME:
                raise ValueError(f"OperatorAccess {construct_id}: the document name {name!r} "
                                 f"is longer than SSM's {MAX_DOCUMENT_NAME} characters: a "
                                 "shorter cluster_id or user")
            out[user] = OperatorDocument(self, f"UserDocument-{user}", user=user, name=name)
        return out

    @property
    def policy_arn(self) -> str:
        return self.policy.managed_policy_arn

    @property
    def admin_policy_arn(self) -> str:
        return self.admin_policy.managed_policy_arn

    @property
    def document_name(self) -> str:
        """The any-user Command document (the name CloudFormation generated)."""
        return self.document.document_name

"""The EMR stack's deletion ends: EMR's cross references between its managed security groups
are revoked before CloudFormation deletes the groups.

WHY: EMR adds rules to its managed groups that name each other
(https://docs.aws.amazon.com/emr/latest/ManagementGuide/emr-man-sec-groups.html). The
stack does not own those rules, so after deleting the cluster CloudFormation tries to delete
a group another group's rule still names, EC2 answers ``DependencyViolation``, and the
deletion fails with the groups left. ``Custom::EmrSecurityGroupRelease`` names the groups
(deleted before them) and the cluster depends on it (deleted after the cluster's nodes are
gone); its Delete revokes every rule of the groups that names a security group
(``lambda_src/emr_security_groups.py``). The template's own rules between groups
(``AWS::EC2::SecurityGroupIngress`` / ``Egress`` declared up to now) depend on it, so
CloudFormation deletes them first and never finds one already revoked.

A small function of its own answers (``emr_teardown.handler``, the ``lambda_src`` asset):
the EMR stack has no other. Its role: ``ec2:DescribeSecurityGroups`` (no resource-level
permissions) and the two revoke calls on the named groups only; its log group is kept one
month.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from constructs_lib.package_paths import ASSET_EXCLUDES, lambda_source_dir

RESOURCE_TYPE = "Custom::EmrSecurityGroupRelease"
HANDLER = "emr_teardown.handler"
RUNTIME = lambda_.Runtime.PYTHON_3_14
#: Revoking a few dozen rules takes seconds; the rest is margin for EC2's throttling.
DEFAULT_TIMEOUT = Duration.minutes(2)
DEFAULT_LOG_RETENTION = logs.RetentionDays.ONE_MONTH


class EmrSecurityGroupRelease(Construct):
    """Revokes the rules by which ``groups`` name security groups, when the stack deletes
    them, after ``cluster``."""

    def __init__(self, scope: Construct, construct_id: str, *,
                 groups: Sequence[ec2.SecurityGroup], cluster: Construct,
                 timeout: Duration = DEFAULT_TIMEOUT,
                 log_retention: logs.RetentionDays = DEFAULT_LOG_RETENTION) -> None:
        """
        :param groups: EMR's managed security groups (primary, core, service access).
        :param cluster: the EMR cluster (deleted before the rules are revoked).
        :param timeout: the function's timeout. :default: 2 minutes
        :param log_retention: how long its logs are kept. :default: one month
        """
        super().__init__(scope, construct_id)
        if not groups:
            raise ValueError(f"EmrSecurityGroupRelease {construct_id}: groups must name at "
                             "least one security group")
        stack = Stack.of(self)
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention,
                                       removal_policy=RemovalPolicy.DESTROY)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                             description="Revokes EMR's rules between its managed security "
                                         "groups when the stack is deleted")
        self.log_group.grant_write(self.role)
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadTheGroupsRules", actions=["ec2:DescribeSecurityGroups"],
            resources=["*"]))  # DescribeSecurityGroups supports no resource-level permissions
        self.role.add_to_policy(iam.PolicyStatement(
            sid="RevokeRulesOfTheManagedGroupsOnly",
            actions=["ec2:RevokeSecurityGroupIngress", "ec2:RevokeSecurityGroupEgress"],
            resources=[stack.format_arn(service="ec2", resource="security-group",
                                        resource_name=g.security_group_id) for g in groups]))
        self.function = lambda_.Function(
            self, "Function", runtime=RUNTIME, handler=HANDLER,
            code=lambda_.Code.from_asset(str(lambda_source_dir()), exclude=ASSET_EXCLUDES),
            role=self.role, timeout=timeout, memory_size=128, log_group=self.log_group,
            description="Revokes EMR's rules between its managed security groups at deletion")
        self.resource = CustomResource(
            self, "Resource", service_token=self.function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties={"SecurityGroupIds": [g.security_group_id for g in groups]})
        policy = self.role.node.try_find_child("DefaultPolicy")
        if policy is not None:  # its Delete needs the grant
            self.resource.node.add_dependency(policy)
        # It names the groups (deleted before them); the template's own rules between
        # groups depend on it (deleted before the revoke). Not on a group's whole subtree:
        # its rules are in it.
        for group in groups:
            for child in group.node.find_all():
                if isinstance(child, (ec2.CfnSecurityGroupIngress, ec2.CfnSecurityGroupEgress)):
                    child.node.add_dependency(self.resource)
        cluster.node.add_dependency(self.resource)

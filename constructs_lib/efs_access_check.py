"""An existing EFS checked before the nodes launch: ``Custom::EfsAccessCheck``.

WHY: with ``efsFileSystemId`` the mount targets' security groups are the user's. When none
admits NFS (TCP 2049) from the nodes, every mount times out, the master signals FAILURE
after its 300 s wait and the rollback deletes what the user attached
(https://docs.aws.amazon.com/efs/latest/ug/network-access.html). Both groups depend on this
resource, so such a deploy fails in seconds naming each zone's missing mount target or rule
and the command that adds it (``lambda_src/efs_access.py``: the decision is its pure
``problems``). The capacity adjuster's function answers; its role gains the two EFS reads on
this file system and EC2's DescribeSubnets and DescribeSecurityGroups (which take no
resource).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import CustomResource, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from constructs_lib.capacity_adjuster import CapacityAdjuster
from constructs_lib.node_group import NodeGroup

RESOURCE_TYPE = "Custom::EfsAccessCheck"


class EfsAccessCheck(Construct):
    """Fails the deploy before ``groups`` launch when the nodes could not mount
    ``file_system_id``."""

    def __init__(self, scope: Construct, construct_id: str, *, file_system_id: str,
                 node_security_group: ec2.ISecurityGroup, subnets: Sequence[ec2.ISubnet],
                 adjuster: CapacityAdjuster, groups: Sequence[NodeGroup]) -> None:
        """
        :param file_system_id: the existing file system (``fs-...``).
        :param node_security_group: the nodes' security group.
        :param subnets: every subnet the nodes may launch in (zone moves included).
        :param adjuster: whose function answers, and whose role gains the reads.
        :param groups: the node groups, created after the check.
        """
        super().__init__(scope, construct_id)
        if not subnets:
            raise ValueError(f"EfsAccessCheck {construct_id}: subnets must name at least one "
                             "subnet")
        file_system_arn = Stack.of(self).format_arn(
            service="elasticfilesystem", resource="file-system", resource_name=file_system_id)
        policy = adjuster.role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReadTheExistingFileSystemsMountTargets",
            actions=["elasticfilesystem:DescribeMountTargets",
                     "elasticfilesystem:DescribeMountTargetSecurityGroups"],
            resources=[file_system_arn]))
        adjuster.role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReadTheMountTargetsRules",
            actions=["ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"],
            resources=["*"]))  # neither takes a resource (Service Authorization Reference)
        unique = list(dict.fromkeys(s.subnet_id for s in subnets))
        self.resource = CustomResource(
            self, "Resource", service_token=adjuster.function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties={"FileSystemId": file_system_id,
                        "NodeSecurityGroupId": node_security_group.security_group_id,
                        "SubnetIds": unique})
        if policy.policy_dependable is not None:
            self.resource.node.add_dependency(policy.policy_dependable)
        for group in groups:
            group.auto_scaling_group.node.add_dependency(self.resource)

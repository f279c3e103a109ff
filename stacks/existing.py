"""Existing resources named by context keys, imported for the cluster construct a stack creates.

The ``vpcId`` / ``emrVpcId`` VPC is imported from its ids and its subnets' (never looked up:
synth makes no AWS call, in CI neither): :func:`existing_vpc`.

The ``efsFileSystemId`` / ``emrEfsFileSystemId`` file system needs a group for its mount
targets in the cluster's VPC. That VPC is the cluster construct's (DLClusterStack: the one
``vpcId`` imports, which an existing file system requires; the EMR stack: the new one the
construct creates), so the group refers to it lazily (the reference resolves at synth time,
once the cluster exists).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aws_cdk import Annotations, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from constructs import Construct

from constructs_lib import SharedFileSystem
from constructs_lib.late import late_string

#: CDK leaves constructs with this id out of logical ids.
_HIDDEN_ID = "Default"


def existing_vpc(stack: Stack, *, vpc_id: str | None, availability_zones: Sequence[str] | None,
                 private_subnet_ids: Sequence[str] | None,
                 public_subnet_ids: Sequence[str] | None = None) -> ec2.IVpc | None:
    """The VPC ``vpc_id`` ("ExistingVpc") with its subnets, their zones in the same order;
    None without a ``vpc_id`` (the cluster construct then creates one)."""
    if not vpc_id:
        return None
    vpc = ec2.Vpc.from_vpc_attributes(
        stack, "ExistingVpc", vpc_id=vpc_id,
        availability_zones=list(availability_zones or ()),
        private_subnet_ids=list(private_subnet_ids or ()),
        public_subnet_ids=list(public_subnet_ids) if public_subnet_ids else None)
    # The nodes' subnets need no route table here (nothing adds routes to them).
    Annotations.of(vpc).acknowledge_warning(
        "@aws-cdk/aws-ec2:noSubnetRouteTableId",
        "the cluster adds no routes to an existing VPC's subnets")
    return vpc


def existing_file_system(
    stack: Stack, *, cluster_construct_id: str, file_system_id: str,
    cluster_vpc: Callable[[], ec2.IVpc],
) -> efs.IFileSystem:
    """Import ``file_system_id`` with a new mount-target access group ("MountTargetAccess":
    NFS from the cluster's nodes, to attach to the file system's mount targets) in the VPC
    that ``cluster_vpc()`` returns once the cluster construct ``cluster_construct_id`` exists.

    The group keeps the logical id it had when the cluster construct imported file systems
    itself (``<cluster>/SharedStorage/MountTargetAccess``): under a construct named
    ``Default``, which CDK leaves out of logical ids, so deployed stacks keep the group (and
    the mount targets it is attached to) and its NFS rule.
    """
    scope = Construct(Construct(stack, _HIDDEN_ID), cluster_construct_id)
    vpc = ec2.Vpc.from_vpc_attributes(
        scope, "ClusterVpc", vpc_id=late_string(lambda: cluster_vpc().vpc_id),
        availability_zones=stack.availability_zones,
    )
    return SharedFileSystem.from_file_system_id(
        scope, "SharedStorage", file_system_id=file_system_id, vpc=vpc
    )

"""What the node roles of a DeepLearningCluster may do beyond their groups' own grants: the
master's reads for the health gate and the cost ledger, the master queue (the master alone),
the membership key (the master signs, every node verifies), the node scripts and EFS; and
the order the groups are created in. Called once by ``DeepLearningCluster``."""

from __future__ import annotations

from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3_assets as s3_assets

from constructs_lib.capacity_adjuster import CapacityAdjuster
from constructs_lib.metadata_queues import MetadataQueues
from constructs_lib.node_group import NodeGroup, grant_node_access


def grant_node_roles(*, master: NodeGroup, workers: NodeGroup, queues: MetadataQueues,
                     membership_key: kms.IKey, node_scripts: s3_assets.Asset,
                     file_system: efs.IFileSystem, capacity_adjuster: CapacityAdjuster) -> None:
    """The master's and the workers' grants, and the groups' creation order."""
    # The health gate on the master (dl-health --deep, before each managed attempt)
    # compares each node's GPUs with what EC2 says its instance type has.
    master.role.add_to_principal_policy(iam.PolicyStatement(
        sid="GpuCountsOfInstanceTypes", actions=["ec2:DescribeInstanceTypes"],
        resources=["*"]))  # no resource-level permissions for this Describe API
    # The job controller prices each job's nodes for its cost ledger (bootstrap_scripts/ops/
    # prices.py): the Price List and the Spot price history, read-only, no resource ARNs.
    master.role.add_to_principal_policy(iam.PolicyStatement(
        sid="PricesOfJobNodes",
        actions=["pricing:GetProducts", "ec2:DescribeSpotPriceHistory"], resources=["*"]))
    # Only the master consumes the master queue: a worker that could receive or delete
    # there could swallow what the master must learn (docs/security.md).
    queues.grant_agent_access(master.role)
    queues.grant_lost_notifications_read(master.role)
    # Only the master signs the membership; every node checks the master's signature with
    # the key's public half, fetched once at agent start (kms:GetPublicKey) and used locally
    # (bootstrap_scripts/agent/membership_key.py): no kms:Verify per document.
    membership_key.grant(master.role, "kms:Sign")
    for group in (master, workers):
        membership_key.grant(group.role, "kms:GetPublicKey")
    for group in (master, workers):
        grant_node_access(group.role, node_scripts=node_scripts,
                          file_system=file_system)
        # The subscription must exist before the first launch notification is sent, and
        # nodes boot only once EFS has a mount target to mount.
        group.auto_scaling_group.node.add_dependency(
            capacity_adjuster, file_system.mount_targets_available)
    # As in the original: workers are created after the master group.
    workers.auto_scaling_group.node.add_dependency(
        master.auto_scaling_group
    )

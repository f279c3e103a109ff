"""The roles of an :class:`~constructs_lib.emr_cluster.EmrDeepLearningCluster` and what each
may do: the nodes' instance role (and its instance profile), and EMR's service role.

The cluster module builds the network, storage, logs and bootstrap assets; the roles need
all of those (each grant names one of them) and the ``AWS::EMR::Cluster`` needs the roles,
so they are made here, in one call (:func:`add_emr_roles`), as children of the cluster
itself (their construct ids, and so the template's logical ids, are the cluster's own):

- ``InstanceRole`` (+ ``InstanceProfile``): SSM Session Manager, and only what the bootstrap
  actions, the membership watcher and EMR's log pusher need: read the bootstrap scripts,
  write the cluster's logs, mount EFS as root, list the instances of this cluster alone (by
  its ``dl-cluster:id`` tag: the cluster id is only known after creation), the GPU counts
  of instance types, the local-disk key, and the TLS certificates' object when given;
- ``ServiceRole``: ``AmazonEMRServicePolicy_v2``, ``iam:PassRole`` of exactly the instance
  role (the policy alone passes only roles named ``EMR_EC2_DefaultRole``) and the local-disk
  key's grants for the EBS volumes EMR attaches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Stack
from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY


@dataclass(frozen=True)
class EmrRoles:
    """The roles :func:`add_emr_roles` made (the cluster's attributes of the same names)."""

    instance_role: iam.Role
    instance_profile: iam.InstanceProfile
    service_role: iam.Role


def add_emr_roles(cluster: Construct, *, cluster_tag: str,
                  bootstrap_scripts: Sequence[s3_assets.Asset], log_objects_arn: str,
                  file_system: efs.IFileSystem, local_disk_key: kms.IKey,
                  tls_certificates: tuple[str, str] | None) -> EmrRoles:
    """The roles, as children of ``cluster`` (see the module's docstring).
    ``bootstrap_scripts``: the assets the bootstrap actions read; ``log_objects_arn``: the
    log objects the nodes write; ``tls_certificates``: the (bucket, key) of the in-transit
    encryption certificates, or None."""
    instance_role = iam.Role(
        cluster, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
        description="EMR nodes of the deep-learning cluster (least privilege)",
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
            "AmazonSSMManagedInstanceCore")])
    instance_profile = iam.InstanceProfile(cluster, "InstanceProfile", role=instance_role)
    _grant_node_access(instance_role, cluster_tag=cluster_tag,
                       bootstrap_scripts=bootstrap_scripts, log_objects_arn=log_objects_arn,
                       file_system=file_system, local_disk_key=local_disk_key,
                       tls_certificates=tls_certificates)

    service_role = iam.Role(
        cluster, "ServiceRole",
        assumed_by=iam.ServicePrincipal("elasticmapreduce.amazonaws.com"),
        description="EMR service role of the deep-learning cluster",
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
            "service-role/AmazonEMRServicePolicy_v2")])
    # Policy v2 only passes roles named EMR_EC2_DefaultRole: pass exactly ours instead.
    service_role.add_to_principal_policy(iam.PolicyStatement(
        sid="PassInstanceRole", actions=["iam:PassRole"],
        resources=[instance_role.role_arn],
        conditions={"StringLike": {"iam:PassedToService": "ec2.amazonaws.com*"}}))
    # EBS encryption with our key: EMR creates grants for the volumes it attaches.
    service_role.add_to_principal_policy(iam.PolicyStatement(
        sid="EncryptNodeVolumes",
        actions=["kms:CreateGrant", "kms:DescribeKey", "kms:GenerateDataKeyWithoutPlaintext",
                 "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:Decrypt"],
        resources=[local_disk_key.key_arn]))
    return EmrRoles(instance_role=instance_role, instance_profile=instance_profile,
                    service_role=service_role)


def _grant_node_access(role: iam.Role, *, cluster_tag: str,
                       bootstrap_scripts: Sequence[s3_assets.Asset], log_objects_arn: str,
                       file_system: efs.IFileSystem, local_disk_key: kms.IKey,
                       tls_certificates: tuple[str, str] | None) -> None:
    """What the bootstrap actions, the membership watcher and EMR's log pusher need."""
    role.add_to_principal_policy(iam.PolicyStatement(
        sid="ReadBootstrapScripts", actions=["s3:GetObject"],
        resources=[a.bucket.arn_for_objects(a.s3_object_key) for a in bootstrap_scripts]))
    role.add_to_principal_policy(iam.PolicyStatement(
        sid="WriteClusterLogs", actions=["s3:PutObject"], resources=[log_objects_arn]))
    # The EFS bootstrap action waits until the file system and its mount targets are
    # available, then mounts it (as root, through a mount target) and hands it to hadoop.
    file_system.grant(role, "elasticfilesystem:DescribeFileSystems",
                      "elasticfilesystem:DescribeMountTargets")
    file_system.grant_root_access(role)
    # The cluster id is only known after creation; the tag limits this to our cluster.
    stack = Stack.of(role)
    role.add_to_principal_policy(iam.PolicyStatement(
        sid="ListOwnClusterInstances",
        actions=["elasticmapreduce:ListInstances", "elasticmapreduce:DescribeCluster"],
        resources=[stack.format_arn(service="elasticmapreduce", resource="cluster",
                                    resource_name="*")],
        conditions={"StringEquals": {
            f"elasticmapreduce:ResourceTag/{CLUSTER_TAG_KEY}": cluster_tag}}))
    role.add_to_principal_policy(iam.PolicyStatement(
        sid="GpuCountsOfInstanceTypes", actions=["ec2:DescribeInstanceTypes"],
        resources=["*"]))  # no resource-level permissions for this read-only API
    role.add_to_principal_policy(iam.PolicyStatement(
        sid="LocalDiskEncryption",
        actions=["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
        resources=[local_disk_key.key_arn]))
    if tls_certificates is not None:
        bucket, key = tls_certificates
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReadTlsCertificates", actions=["s3:GetObject"],
            resources=[stack.format_arn(
                service="s3", region="", account="", resource=bucket, resource_name=key)]))

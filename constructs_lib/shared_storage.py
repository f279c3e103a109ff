"""Shared EFS file system for code, data, checkpoints and the cluster's membership files."""

from __future__ import annotations

import jsii
from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from constructs import Construct, IDependable

from constructs_lib import validation

#: Where every node mounts the shared file system.
DEFAULT_MOUNT_POINT = "/efs"
#: What happens to a new file system when its stack is deleted: your data outlives it.
DEFAULT_REMOVAL_POLICY = RemovalPolicy.RETAIN
#: Description of the NFS rule that lets cluster nodes reach the mount targets.
NFS_RULE_DESCRIPTION = "NFS from cluster nodes"


@jsii.implements(ec2.IConnectable)
class SharedFileSystem(Construct):
    """A new encrypted EFS file system with a mount target in each selected subnet.

    Encrypted at rest (AWS-managed key), general purpose performance, elastic throughput,
    automatic backups, and a security group on the mount targets that admits nothing until
    you open NFS (2049) to a peer with :meth:`allow_from` (or ``connections``).

    ``connections`` and the ``grant_*`` methods are CDK's own (``efs.FileSystem``), so a node
    group is wired with ``fs.allow_from(nodes)`` and ``fs.grant_root_access(role)``. An
    existing file system is imported with :meth:`from_file_system_id`.
    """

    @validation.reports_path
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        security_group: ec2.ISecurityGroup | None = None,
        mount_point: str = DEFAULT_MOUNT_POINT,
        vpc_subnets: ec2.SubnetSelection | None = None,
        require_tls: bool = True,
        removal_policy: RemovalPolicy = DEFAULT_REMOVAL_POLICY,
    ) -> None:
        """
        :param vpc: the VPC of the mount targets.
        :param security_group: security group of the mount targets.
            :default: a new group without rules (open it with :meth:`allow_from`)
        :param mount_point: where the nodes mount the file system.
            :default: ``/efs``
        :param vpc_subnets: subnets that get a mount target.
            :default: every private subnet with egress
        :param require_tls: refuse clients that do not use TLS (a file-system policy that
            denies ``aws:SecureTransport=false``; nodes mount with efs-utils ``-o tls``).
            :default: True
        :param removal_policy: what happens to the file system when its stack is deleted.
            :default: ``RemovalPolicy.RETAIN``
        """
        super().__init__(scope, construct_id)
        self.mount_point = validation.mount_point("mount_point", mount_point)
        self.security_group = security_group or ec2.SecurityGroup(
            self,
            "MountTargets",
            vpc=vpc,
            allow_all_outbound=False,
            description="EFS mount targets: NFS (2049) from cluster nodes only",
        )
        self.file_system = efs.FileSystem(
            self,
            "FileSystem",
            vpc=vpc,
            vpc_subnets=vpc_subnets
            or ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            security_group=self.security_group,
            encrypted=True,
            performance_mode=efs.PerformanceMode.GENERAL_PURPOSE,
            throughput_mode=efs.ThroughputMode.ELASTIC,
            removal_policy=removal_policy,
            enable_automatic_backups=True,
        )
        if require_tls:
            self.file_system.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="DenyUnencryptedTransport",
                    effect=iam.Effect.DENY,
                    principals=[iam.AnyPrincipal()],
                    actions=["*"],
                    conditions={"Bool": {"aws:SecureTransport": "false"}},
                )
            )
        self.file_system_id = self.file_system.file_system_id

    @staticmethod
    def from_file_system_id(
        scope: Construct,
        construct_id: str,
        *,
        file_system_id: str,
        security_group: ec2.ISecurityGroup | None = None,
        vpc: ec2.IVpc | None = None,
    ) -> efs.IFileSystem:
        """Import an existing file system (``fs-...``) to pass as a construct's ``file_system``.

        ``security_group`` is the group of its mount targets, to which the cluster adds its
        NFS rule. Without one, a new group is created in ``vpc`` ("MountTargetAccess", no
        rules until a cluster opens NFS from its nodes): attach it to the file system's
        mount targets in that VPC.
        """
        name = f"{scope.node.path}/{construct_id}"
        try:
            validation.file_system_id("file_system_id", file_system_id)
            if security_group is None and vpc is None:
                raise validation.ConfigError(
                    "give the mount targets' security_group, or the vpc to create one in"
                )
        except validation.ConfigError as exc:
            exc.path = name
            raise
        imported = Construct(scope, construct_id)
        if security_group is None:
            security_group = ec2.SecurityGroup(
                imported,
                "MountTargetAccess",
                vpc=vpc,  # type: ignore[arg-type]
                allow_all_outbound=False,
                description="Attach to the existing EFS mount targets: NFS from cluster nodes",
            )
        return efs.FileSystem.from_file_system_attributes(
            imported, "FileSystem", file_system_id=file_system_id, security_group=security_group
        )

    @property
    def connections(self) -> ec2.Connections:
        """The mount targets' connections (default port 2049)."""
        return self.file_system.connections

    @property
    def mount_targets_available(self) -> IDependable:
        """Depend on this to start clients only once every mount target exists."""
        return self.file_system.mount_targets_available

    def allow_from(self, peer: ec2.IConnectable) -> None:
        """Let ``peer`` (e.g. a node group) reach NFS on the mount targets, and nothing else."""
        self.connections.allow_default_port_from(peer, NFS_RULE_DESCRIPTION)

    def grant_read(self, grantee: iam.IGrantable) -> iam.Grant:
        """Mount read-only through a mount target (``efs.FileSystem.grant_read``)."""
        return self.file_system.grant_read(grantee)

    def grant_read_write(self, grantee: iam.IGrantable) -> iam.Grant:
        """Mount and write through a mount target (``efs.FileSystem.grant_read_write``)."""
        return self.file_system.grant_read_write(grantee)

    def grant_root_access(self, grantee: iam.IGrantable) -> iam.Grant:
        """Mount, write and act as root through a mount target
        (``efs.FileSystem.grant_root_access``): what the node agents need."""
        return self.file_system.grant_root_access(grantee)

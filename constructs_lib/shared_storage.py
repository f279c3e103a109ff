"""Shared EFS file system for code, data, checkpoints and the cluster's membership files."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from constructs import Construct

from constructs_lib import validation

DEFAULT_MOUNT_POINT = "/efs"


class SharedFileSystem(Construct):
    """A new encrypted EFS, or an existing one by id (plus its security group).

    Defaults for a new file system: encrypted at rest (AWS-managed key), general purpose
    performance, elastic throughput, RETAIN on stack deletion (your data outlives the
    cluster), one mount target per private subnet, a security group that allows NFS (2049)
    only from peers you open with :meth:`allow_from`, and a file-system policy that refuses
    clients not using TLS (encryption in transit).

    ``connections`` and ``grant_read_write`` follow the CDK idioms, so a node group is
    wired with ``fs.allow_from(nodes)`` and ``fs.grant_read_write(role)``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        file_system_id: str | None = None,
        security_group: ec2.ISecurityGroup | None = None,
        mount_point: str = DEFAULT_MOUNT_POINT,
        vpc_subnets: ec2.SubnetSelection | None = None,
        require_tls: bool = True,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        self.mount_point = validation.mount_point("mount_point", mount_point)
        subnets = vpc_subnets or ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        if file_system_id:
            validation.file_system_id("file_system_id", file_system_id)
            if security_group is None:
                security_group = ec2.SecurityGroup(
                    self,
                    "MountTargetAccess",
                    vpc=vpc,
                    allow_all_outbound=False,
                    description="Attach to the existing EFS mount targets: NFS from cluster nodes",
                )
            self.security_group = security_group
            self.file_system: efs.IFileSystem = efs.FileSystem.from_file_system_attributes(
                self, "FileSystem", file_system_id=file_system_id, security_group=security_group
            )
            self.created = False
        else:
            self.security_group = security_group or ec2.SecurityGroup(
                self,
                "MountTargets",
                vpc=vpc,
                allow_all_outbound=False,
                description="EFS mount targets: NFS (2049) from cluster nodes only",
            )
            fs = efs.FileSystem(
                self,
                "FileSystem",
                vpc=vpc,
                vpc_subnets=subnets,
                security_group=self.security_group,
                encrypted=True,
                performance_mode=efs.PerformanceMode.GENERAL_PURPOSE,
                throughput_mode=efs.ThroughputMode.ELASTIC,
                removal_policy=removal_policy,
                enable_automatic_backups=True,
            )
            if require_tls:
                fs.add_to_resource_policy(
                    iam.PolicyStatement(
                        sid="DenyUnencryptedTransport",
                        effect=iam.Effect.DENY,
                        principals=[iam.AnyPrincipal()],
                        actions=["*"],
                        conditions={"Bool": {"aws:SecureTransport": "false"}},
                    )
                )
            self.file_system = fs
            self.created = True
        self.file_system_id = self.file_system.file_system_id

    @property
    def connections(self) -> ec2.Connections:
        return self.file_system.connections

    def allow_from(self, peer: ec2.IConnectable) -> None:
        """Let ``peer`` (e.g. a node group) reach NFS on the mount targets, and nothing else."""
        self.file_system.connections.allow_default_port_from(peer, "NFS from cluster nodes")

    def grant_read_write(self, grantee: iam.IGrantable) -> iam.Grant:
        return self.file_system.grant_read_write(grantee)

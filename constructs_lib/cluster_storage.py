"""A cluster's storage: EFS (new or given), S3 for data and checkpoints, FSx for Lustre.

:class:`~constructs_lib.cluster.DeepLearningCluster` makes its storage in one call
(:func:`add_cluster_storage`), as children of the cluster itself (their construct ids, and
so the template's logical ids, are the cluster's own), and opens it to its nodes once their
security group exists (:meth:`ClusterStorage.admit`):

- ``SharedStorage``: a new ``SharedFileSystem`` (``shared_storage.py``) unless a
  ``file_system`` is given, which then brings its own security groups;
- ``TrainingData``: the data bucket's prefix and the checkpoint bucket (``training_data.py``;
  the VPC's S3 gateway endpoint keeps that traffic off the NAT: ``ClusterNetwork``);
- ``Lustre``: with ``shared_storage="fsx-lustre"``, FSx for Lustre next to EFS in the
  nodes' first subnet (``lustre_storage.py``), never on EFS's mount point.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib import validation
from constructs_lib.lustre_storage import LustreStorage, check_shared_storage, first_subnet
from constructs_lib.shared_storage import NFS_RULE_DESCRIPTION, SharedFileSystem
from constructs_lib.training_data import TrainingData


@dataclass(frozen=True)
class ClusterStorage:
    """The storage :func:`add_cluster_storage` made or was given (the cluster's attributes
    of the same names)."""

    #: the new file system's construct (None: a ``file_system`` was given)
    storage: SharedFileSystem | None
    file_system: efs.IFileSystem
    training_data: TrainingData
    #: FSx for Lustre (None unless ``shared_storage="fsx-lustre"``)
    lustre: LustreStorage | None

    def admit(self, nodes: ec2.IConnectable) -> None:
        """The file systems admit the nodes: NFS (EFS's connections' default port, 2049) and
        Lustre's ports."""
        if self.storage is not None:
            self.storage.allow_from(nodes)
        else:
            self.file_system.connections.allow_default_port_from(nodes, NFS_RULE_DESCRIPTION)
        if self.lustre is not None:
            self.lustre.allow_from(nodes)


def add_cluster_storage(cluster: Construct, *, vpc: ec2.IVpc, cluster_id: str,
                        file_system: efs.IFileSystem | None,
                        efs_security_group: ec2.ISecurityGroup | None, efs_mount_point: str,
                        efs_require_tls: bool, data_bucket: s3.IBucket | None, data_prefix: str,
                        checkpoint_bucket: s3.IBucket | None, shared_storage: str,
                        node_subnets: ec2.SubnetSelection) -> ClusterStorage:
    """The cluster's storage, as children of ``cluster`` (see the module's docstring)."""
    storage: SharedFileSystem | None = None
    if file_system is None:
        storage = SharedFileSystem(
            cluster,
            "SharedStorage",
            vpc=vpc,
            security_group=efs_security_group,
            mount_point=efs_mount_point,
            require_tls=efs_require_tls,
        )
        file_system = storage.file_system
    training_data = TrainingData(
        cluster, "TrainingData", cluster_id=cluster_id, data_bucket=data_bucket,
        data_prefix=data_prefix, checkpoint_bucket=checkpoint_bucket)
    lustre = LustreStorage(
        cluster, "Lustre", vpc=vpc, data_bucket=data_bucket, data_prefix=data_prefix,
        subnet=first_subnet(vpc, node_subnets),
    ) if check_shared_storage("shared_storage", shared_storage) == "fsx-lustre" else None
    if lustre is not None and lustre.mount_point == efs_mount_point:
        raise validation.ConfigError(f"efs_mount_point {efs_mount_point} is where "
                                     f"FSx for Lustre mounts (shared_storage=fsx-lustre)")
    return ClusterStorage(storage=storage, file_system=file_system,
                          training_data=training_data, lustre=lustre)

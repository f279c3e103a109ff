"""LustreStorage: an FSx for Lustre file system for training data (``sharedStorage=fsx-lustre``).

EFS stays the cluster's shared file system (its membership files, the jobs' directories,
code and checkpoints: small files, many clients, no capacity to plan). This adds a Lustre
file system next to it, mounted at ``/fsx`` on every node, for the data a training job
reads at high throughput:

- PERSISTENT_2 (SSD, its data replicated within its zone), ``storage_capacity_gib`` of
  storage (1,200 GiB, or a multiple of 2,400 GiB) at ``throughput_per_tib`` MB/s per TiB
  (125, 250, 500 or 1,000): the file system's throughput is the product, e.g. 1.17 TiB at
  250 MB/s/TiB = 293 MB/s (https://docs.aws.amazon.com/fsx/latest/LustreGuide/managing-throughput-capacity.html,
  https://docs.aws.amazon.com/fsx/latest/LustreGuide/performance.html);
- encrypted at rest with a customer-managed KMS key of its own (rotating);
- Lustre (TCP 988 and 1018-1023) both ways between the file system and the node groups
  given to :meth:`allow_from` (its servers also open connections to the clients, so the
  clients' groups admit the file system's, and its group may send to theirs), and within
  its own group (the file system's interfaces talk to each other); nothing else
  (https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html);
- Lustre 2.15 (``FileSystemTypeVersion``): PERSISTENT_2 offers 2.12 and 2.15, and the nodes'
  Amazon Linux 2023 Lustre client is 2.15 (https://docs.aws.amazon.com/fsx/latest/LustreGuide/install-lustre-client.html).
  The version is fixed at creation: a cluster deployed with 2.12 whose stack is updated gets
  a new file system (a cache of S3: re-imported); ``lustre_version="2.12"`` keeps the old one;
- with a data bucket, a data repository association links ``/fsx/data`` to
  ``s3://bucket/prefix``: the objects' metadata is imported when it is created, new, changed
  and deleted objects are imported as S3 reports them, and file contents load from S3 on
  first read (https://docs.aws.amazon.com/fsx/latest/LustreGuide/create-dra-linked-data-repo.html).
  Nothing is exported back: the dataset in S3 is never written by the cluster.

The file system lives in one subnet (one zone): nodes in another zone reach it across zones.
It is a cache of the S3 data, so it is deleted with the stack (``removal_policy``).
"""

from __future__ import annotations

from aws_cdk import Aws, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib import validation

#: Where every node mounts the Lustre file system.
DEFAULT_LUSTRE_MOUNT_POINT = "/fsx"
#: The smallest PERSISTENT_2 file system; larger ones grow in steps of 2,400 GiB.
DEFAULT_STORAGE_GIB = 1200
STORAGE_STEP_GIB = 2400
#: MB/s per TiB of storage; PERSISTENT_2 offers these tiers.
DEFAULT_THROUGHPUT_PER_TIB = 250
THROUGHPUT_TIERS = (125, 250, 500, 1000)
#: Lustre's ports: LNet (988) and the range its servers and clients also use.
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))
#: Lustre versions PERSISTENT_2 file systems offer; new ones get the newest.
LUSTRE_VERSIONS = ("2.12", "2.15")
DEFAULT_LUSTRE_VERSION = "2.15"
#: Where the data repository association puts the data bucket's prefix in the file system.
DATA_PATH = "/data"
#: The values ``sharedStorage`` takes.
SHARED_STORAGE_KINDS = ("efs", "fsx-lustre")


def check_shared_storage(name: str, value: object) -> str:
    """``efs`` (the cluster's EFS only) or ``fsx-lustre`` (EFS plus a Lustre file system)."""
    if value not in SHARED_STORAGE_KINDS:
        raise validation.ConfigError(
            f"{name} must be one of {', '.join(SHARED_STORAGE_KINDS)}, got {value!r}")
    return str(value)


def check_storage_gib(name: str, value: object) -> int:
    gib = validation.positive_int(name, value, minimum=DEFAULT_STORAGE_GIB)
    if gib != DEFAULT_STORAGE_GIB and gib % STORAGE_STEP_GIB:
        raise validation.ConfigError(
            f"{name} must be {DEFAULT_STORAGE_GIB} or a multiple of {STORAGE_STEP_GIB} GiB "
            f"(FSx for Lustre PERSISTENT_2), got {value!r}")
    return gib


def first_subnet(vpc: ec2.IVpc, selection: ec2.SubnetSelection) -> ec2.ISubnet:
    """The first subnet of ``selection`` (the nodes' first zone): where the file system goes."""
    return vpc.select_subnets(
        availability_zones=selection.availability_zones, subnets=selection.subnets,
        subnet_type=selection.subnet_type, subnet_group_name=selection.subnet_group_name,
    ).subnets[0]


class LustreStorage(Construct):
    """An FSx for Lustre PERSISTENT_2 file system for the nodes' data (module doc)."""

    @validation.reports_path
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        storage_capacity_gib: int = DEFAULT_STORAGE_GIB,
        throughput_per_tib: int = DEFAULT_THROUGHPUT_PER_TIB,
        mount_point: str = DEFAULT_LUSTRE_MOUNT_POINT,
        data_bucket: s3.IBucket | None = None,
        data_prefix: str = "",
        removal_policy: RemovalPolicy = RemovalPolicy.DESTROY,
        lustre_version: str = DEFAULT_LUSTRE_VERSION,
    ) -> None:
        """
        :param vpc: the VPC of the file system.
        :param subnet: the one subnet (zone) of the file system; put the nodes' first.
        :param storage_capacity_gib: SSD storage, 1200 or a multiple of 2400 GiB.
            :default: 1200
        :param throughput_per_tib: MB/s per TiB of storage: 125, 250, 500 or 1000.
            :default: 250 (293 MB/s for 1200 GiB)
        :param mount_point: where the nodes mount it. :default: ``/fsx``
        :param data_bucket: link ``<mount_point>/data`` to this bucket's ``data_prefix``
            (import only). :default: none (an empty file system)
        :param data_prefix: the part of ``data_bucket`` linked. :default: ``""`` (all of it)
        :param removal_policy: what happens to the file system when its stack is deleted.
            :default: ``RemovalPolicy.DESTROY`` (it caches S3 data and exports nothing)
        :param lustre_version: the file system's Lustre version, ``2.12`` or ``2.15`` (fixed
            at creation: changing it replaces the file system).
            :default: ``2.15``
        """
        super().__init__(scope, construct_id)
        storage_capacity_gib = check_storage_gib("storage_capacity_gib", storage_capacity_gib)
        if throughput_per_tib not in THROUGHPUT_TIERS:
            raise validation.ConfigError(
                f"throughput_per_tib must be one of {THROUGHPUT_TIERS} MB/s/TiB "
                f"(PERSISTENT_2), got {throughput_per_tib!r}")
        if lustre_version not in LUSTRE_VERSIONS:
            raise validation.ConfigError(
                f"LustreStorage {construct_id}: lustre_version must be one of "
                f"{', '.join(LUSTRE_VERSIONS)} (PERSISTENT_2), got {lustre_version!r}")
        self.mount_point = validation.mount_point("mount_point", mount_point)
        data_prefix = validation.key_prefix("data_prefix", data_prefix)
        self.key = kms.Key(self, "Key", enable_key_rotation=True, removal_policy=removal_policy,
                           description="Encrypts the cluster's FSx for Lustre file system")
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="FSx for Lustre: Lustre (988, 1018-1023) from the cluster nodes only")
        for port in LUSTRE_PORTS:
            self.security_group.add_ingress_rule(self.security_group, port,
                                                 "Lustre between the file system's interfaces")
            self.security_group.add_egress_rule(self.security_group, port,
                                                "Lustre between the file system's interfaces")
        # The L1 resource: CDK's LustreFileSystem also opens 988-1023 to its own group,
        # wider than the two ranges Lustre uses.
        self.file_system = fsx.CfnFileSystem(
            self, "FileSystem", file_system_type="LUSTRE",
            storage_capacity=storage_capacity_gib, subnet_ids=[subnet.subnet_id],
            security_group_ids=[self.security_group.security_group_id],
            kms_key_id=self.key.key_id, file_system_type_version=lustre_version,
            lustre_configuration=fsx.CfnFileSystem.LustreConfigurationProperty(
                deployment_type="PERSISTENT_2", per_unit_storage_throughput=throughput_per_tib,
                data_compression_type="LZ4"))
        self.file_system.apply_removal_policy(removal_policy)
        self._connections = ec2.Connections(security_groups=[self.security_group])
        self.data_repository: fsx.CfnDataRepositoryAssociation | None = None
        if data_bucket is not None:
            self.data_repository = fsx.CfnDataRepositoryAssociation(
                self, "DataRepository", file_system_id=self.file_system.ref,
                file_system_path=DATA_PATH,
                data_repository_path=f"s3://{data_bucket.bucket_name}/{data_prefix}",
                batch_import_meta_data_on_create=True,
                s3=fsx.CfnDataRepositoryAssociation.S3Property(
                    auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                        events=["NEW", "CHANGED", "DELETED"])))

    @property
    def connections(self) -> ec2.Connections:
        """The file system's security group (no default port: Lustre uses two ranges)."""
        return self._connections

    @property
    def file_system_id(self) -> str:
        return self.file_system.ref

    @property
    def dns_name(self) -> str:
        """``<id>.fsx.<region>.<url suffix>``, the file system's DNS name."""
        return f"{self.file_system.ref}.fsx.{Aws.REGION}.{Aws.URL_SUFFIX}"

    @property
    def mount_name(self) -> str:
        return self.file_system.attr_lustre_mount_name

    @property
    def mount_source(self) -> str:
        """``<dns name>@tcp:/<mount name>``, what ``mount -t lustre`` takes."""
        return f"{self.dns_name}@tcp:/{self.mount_name}"

    def allow_from(self, peer: ec2.IConnectable) -> None:
        """Lustre's ports both ways between ``peer`` (the node groups) and the file system,
        and nothing else: the clients reach its servers, and its servers reach the clients
        (their groups admit the file system's)."""
        for port in LUSTRE_PORTS:
            self.connections.allow_from(peer, port, "Lustre from cluster nodes")
            self.connections.allow_to(peer, port, "Lustre from the file system to its clients")

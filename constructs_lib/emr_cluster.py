"""EmrDeepLearningCluster: an EMR cluster on the Deep Learning AMI, with EFS and membership.

What the original EMR recipe left to be done by hand, as one construct: EMR with the DLAMI
as a custom AMI, EFS mounted at /efs by a bootstrap action, the workers file and
``DEEPLEARNING_*`` environment on EVERY node (written by the same membership code as the EC2
cluster's node agent; nothing is copied between nodes), and ``dl-run`` as an EMR step.
See docs/emr.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import jsii
from aws_cdk import Annotations, Aws, Duration, RemovalPolicy, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_emr as emr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from bootstrap_scripts.data import checksums
from constructs_lib import emr_config, validation
from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY
from constructs_lib.emr_roles import add_emr_roles
from constructs_lib.emr_teardown import EmrSecurityGroupRelease
from constructs_lib.images import deep_learning_ami, image_family
from constructs_lib.log_buckets import access_log_bucket
from constructs_lib.network import DEFAULT_VPC_CIDR, ClusterNetwork
from constructs_lib.package_paths import ASSET_EXCLUDES, node_scripts_dir
from constructs_lib.shared_storage import DEFAULT_MOUNT_POINT, SharedFileSystem

#: A current EMR 7 release. EMR 7 custom AMIs must be based on Amazon Linux 2023.
DEFAULT_RELEASE_LABEL = "emr-7.12.0"
#: Instance type of the primary node and of the core nodes.
DEFAULT_INSTANCE_TYPE = "g5.xlarge"
#: Core nodes (the primary node trains too).
DEFAULT_CORE_INSTANCE_COUNT = 2
#: Root EBS volume size of every node.
DEFAULT_ROOT_VOLUME_GIB = 100
#: Minimal: YARN/HDFS only. Training runs through dl-run, not through an EMR application.
DEFAULT_APPLICATIONS: tuple[str, ...] = ("Hadoop",)
#: The nodes' default ``dl-run --data-checksums``: the node's own (``checksums.WARN``), as on
#: the EC2 cluster.
DEFAULT_DATA_CHECKSUMS = checksums.WARN
#: The DLAMI family EMR accepts: EMR 7.x custom AMIs must be Amazon Linux 2023 based.
EMR_IMAGE_TYPE = "amazon-linux-2023"
#: Tag the EMR managed service policy v2 requires on the VPC, subnets and security groups
#: it may use; without it EMR cannot place the cluster (AccessDenied on RunInstances).
EMR_MANAGED_POLICY_TAG = "for-use-with-amazon-emr-managed-policies"
LOG_PREFIX = "emr-logs/"
#: The bootstrap actions' scripts, relative to the node scripts' directory.
EFS_MOUNT_SCRIPT = "emr/efs_mount.sh"
METADATA_SCRIPT = "emr/metadata.py"


@jsii.implements(ec2.IConnectable)
class EmrDeepLearningCluster(Construct):
    """An EMR cluster for distributed training on the Deep Learning AMI.

    Uniform instance groups (one primary, ``core_instance_count`` core nodes, on-demand),
    a security configuration with at-rest encryption (SSE-S3 for EMRFS, KMS for local disks
    and EBS) and IMDSv2, in-transit encryption only with ``tls_certificates_s3_url``.

    Every node runs two bootstrap actions: ``emr/efs_mount.sh <fs-id> <region> <mount>``
    and ``emr/metadata.py bootstrap ...``, which unpacks the node scripts, installs the
    node's region file, ``dl-run`` (with the cluster's default ``--data-checksums``) and the
    job executor, and starts the watcher that writes the workers file, hostfiles and
    ``DEEPLEARNING_*`` environment from ``ListInstances`` on every node.
    """

    @validation.reports_path
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc | None = None,
        vpc_cidr: str = DEFAULT_VPC_CIDR,
        subnet: ec2.ISubnet | None = None,
        release_label: str = DEFAULT_RELEASE_LABEL,
        applications: Sequence[str] = DEFAULT_APPLICATIONS,
        allow_unstable_applications: bool = False,
        primary_instance_type: ec2.InstanceType | str = DEFAULT_INSTANCE_TYPE,
        core_instance_type: ec2.InstanceType | str = DEFAULT_INSTANCE_TYPE,
        core_instance_count: int = DEFAULT_CORE_INSTANCE_COUNT,
        machine_image: ec2.IMachineImage | None = None,
        root_volume_gib: int = DEFAULT_ROOT_VOLUME_GIB,
        file_system: efs.IFileSystem | None = None,
        efs_security_group: ec2.ISecurityGroup | None = None,
        efs_mount_point: str = DEFAULT_MOUNT_POINT,
        log_bucket: s3.IBucket | None = None,
        tls_certificates_s3_url: str | None = None,
        key_pair: ec2.IKeyPair | None = None,
        cluster_name: str | None = None,
        training_command: Sequence[str] | None = None,
        idle_timeout: Duration | None = None,
        data_checksums: str = DEFAULT_DATA_CHECKSUMS,
    ) -> None:
        """
        :param vpc: the VPC to run in (tag its private subnets for EMR's managed policy).
            :default: a new ``ClusterNetwork`` (2 AZs, private subnets with NAT, flow logs),
                tagged for EMR's managed policy
        :param vpc_cidr: CIDR block of the new VPC (not used with ``vpc``).
            :default: ``10.0.0.0/16``
        :param subnet: the subnet of the instance groups.
            :default: the VPC's first private subnet with egress
        :param release_label: EMR release, emr-7.x or later.
            :default: ``emr-7.12.0``
        :param applications: EMR 7 application names (case-blind).
            :default: ``["Hadoop"]``
        :param allow_unstable_applications: let Hue and Zeppelin through (they failed the
            original's cluster start on the Deep Learning AMI).
            :default: False
        :param primary_instance_type: instance type of the primary node (``ec2.InstanceType``
            or its name).
            :default: ``g5.xlarge``
        :param core_instance_type: instance type of the core nodes (``ec2.InstanceType`` or
            its name).
            :default: ``g5.xlarge``
        :param core_instance_count: core nodes, at least 1.
            :default: 2
        :param machine_image: the custom AMI (Amazon Linux 2023 based);
            ``FixedAmi("ami-...")`` for an AMI id.
            :default: the latest PyTorch Deep Learning AMI for Amazon Linux 2023, resolved at
                deploy time from its public SSM parameter
        :param root_volume_gib: root EBS volume size of every node, at least 50.
            :default: 100
        :param file_system: an existing EFS file system (e.g. from
            ``SharedFileSystem.from_file_system_id``); its security groups go on the nodes.
            :default: a new encrypted, TLS-only ``SharedFileSystem`` (RETAIN)
        :param efs_security_group: security group of the new file system's mount targets
            (not used with ``file_system``).
            :default: a new group
        :param efs_mount_point: where EFS is mounted on every node.
            :default: ``/efs``
        :param log_bucket: where EMR writes its logs (under ``emr-logs/``).
            :default: a new private, encrypted, TLS-only bucket (RETAIN)
        :param tls_certificates_s3_url: ``s3://bucket/key.zip`` of PEM certificates; turns on
            in-transit encryption.
            :default: none (in-transit encryption off)
        :param key_pair: EC2 key pair of the nodes.
            :default: none (use SSM Session Manager)
        :param cluster_name: the cluster's name and its ``dl-cluster:id`` tag, which scopes
            the node role.
            :default: the stack name
        :param training_command: ``dl-run`` arguments for a step at deploy time.
            :default: no step
        :param idle_timeout: terminate after this long idle (1 minute to 7 days).
            :default: never
        :param data_checksums: every node's default of ``dl-run --data-checksums`` (a job's
            own flag still wins): ``required`` fails a ``--data`` job's staging on the first
            object botocore cannot check against S3's checksum, ``warn`` stages and counts
            those. The bootstrap action writes it where dl-run reads it, as the EC2
            cluster's installer does.
            :default: ``warn``
        """
        super().__init__(scope, construct_id)
        # -- validation: every bad prop fails synth with its name and value ----------------------
        self.release_label = emr_config.release_label(release_label)
        self.applications = emr_config.applications(
            applications, allow_unstable=allow_unstable_applications)
        primary_type = validation.instance_type("primary_instance_type", primary_instance_type)
        core_type = validation.instance_type("core_instance_type", core_instance_type)
        self.core_instance_count = validation.positive_int(
            "core_instance_count", core_instance_count)
        self.root_volume_gib = validation.root_volume("root_volume_gib", root_volume_gib)
        self.efs_mount_point = validation.mount_point("efs_mount_point", efs_mount_point)
        if file_system is not None and efs_security_group is not None:
            raise validation.ConfigError(
                "efs_security_group is for the file system the cluster creates; a "
                "file_system brings its own security groups")
        cert_object = (emr_config.s3_object_url("tls_certificates_s3_url",
                                                tls_certificates_s3_url)
                       if tls_certificates_s3_url else None)
        self.training_command = emr_config.training_command(training_command)
        self.data_checksums = validation.checksum_mode("data_checksums", data_checksums)
        if idle_timeout is not None and not idle_timeout.is_unresolved() and not (
                60 <= idle_timeout.to_seconds() <= 7 * 24 * 3600):
            raise validation.ConfigError(
                "idle_timeout must be between 1 minute and 7 days, got "
                f"{idle_timeout.to_seconds()} s")
        stack = Stack.of(self)

        # -- network and shared storage (the same constructs as DLClusterStack) --------------
        self.network = ClusterNetwork(self, "Network", vpc=vpc, cidr=vpc_cidr)
        self.vpc = self.network.vpc
        if subnet is None:
            private = self.vpc.select_subnets(
                subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets
            if not private:
                raise validation.ConfigError(
                    "the VPC has no private subnets with egress; pass subnet explicitly")
            subnet = private[0]
        self.subnet = subnet
        if vpc is None:
            # Our own VPC: tag it so EMR's managed policy v2 may place the cluster in it
            # (its network resources; the flow logs' key is none of EMR's business).
            Tags.of(self.network).add(EMR_MANAGED_POLICY_TAG, "true",
                                      exclude_resource_types=["AWS::KMS::Key"])

        self.storage: SharedFileSystem | None = None
        if file_system is None:
            self.storage = SharedFileSystem(
                self, "SharedStorage", vpc=self.vpc, security_group=efs_security_group,
                mount_point=self.efs_mount_point)
            file_system = self.storage.file_system
        self.file_system: efs.IFileSystem = file_system
        efs_groups = list(file_system.connections.security_groups)
        if not efs_groups:
            raise validation.ConfigError(
                "the file system has no security group to attach to the EMR nodes")
        self.efs_security_groups = efs_groups
        # The nodes carry these groups too, and with AmazonEMRServicePolicy_v2 EMR may launch
        # into tagged groups only: an untagged one makes the cluster fail to launch.
        for group in efs_groups:
            if isinstance(group, ec2.SecurityGroup):  # ours; an imported group: see the docs
                Tags.of(group).add(EMR_MANAGED_POLICY_TAG, "true")
            else:
                Annotations.of(self).add_warning_v2(
                    "dl-cluster:emrUntaggedGroup",
                    f"{self.node.path}: the file system's security group "
                    f"{group.security_group_id} must carry the tag {EMR_MANAGED_POLICY_TAG}"
                    "=true (AmazonEMRServicePolicy_v2 launches only into tagged groups); "
                    "tag it where it is defined")
        # As in the original: the EFS group goes on the nodes as an additional group, and
        # lets its own members reach NFS.
        file_system.connections.allow_default_port_internally(
            "NFS from EMR nodes carrying this group")

        # -- EMR managed security groups (EMR adds its own rules to them) -----------------------
        self.primary_security_group = ec2.SecurityGroup(
            self, "PrimarySecurityGroup", vpc=self.vpc, allow_all_outbound=True,
            description="EMR managed group of the primary node (rules added by EMR)")
        self.core_security_group = ec2.SecurityGroup(
            self, "CoreSecurityGroup", vpc=self.vpc, allow_all_outbound=True,
            description="EMR managed group of the core nodes (rules added by EMR)")
        # A cluster in a private subnet needs a service access group (EMR -> nodes on 8443).
        self.service_access_security_group = ec2.SecurityGroup(
            self, "ServiceAccessSecurityGroup", vpc=self.vpc, allow_all_outbound=False,
            description="EMR service access to the nodes in the private subnet")
        self.service_access_security_group.add_ingress_rule(
            self.primary_security_group, ec2.Port.tcp(9443),
            "EMR: the primary node reaches the service access group on 9443")
        for group in (self.primary_security_group, self.core_security_group,
                      self.service_access_security_group):
            Tags.of(group).add(EMR_MANAGED_POLICY_TAG, "true")

        # -- logs, encryption -------------------------------------------------------------------
        if log_bucket is None:
            # Versioned (overwritten or deleted logs stay recoverable); access logs aside.
            self.log_access_bucket: s3.IBucket | None = access_log_bucket(self)
            self.log_bucket: s3.IBucket = s3.Bucket(
                self, "LogBucket", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL, versioned=True,
                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                removal_policy=RemovalPolicy.RETAIN,
                server_access_logs_bucket=self.log_access_bucket,
                server_access_logs_prefix="log-bucket/")
        else:
            self.log_bucket, self.log_access_bucket = log_bucket, None
        self.log_uri = f"s3://{self.log_bucket.bucket_name}/{LOG_PREFIX}"

        self.local_disk_key = kms.Key(
            self, "LocalDiskKey", enable_key_rotation=True, removal_policy=RemovalPolicy.RETAIN,
            description="EMR local disk and EBS encryption of the deep-learning cluster")
        self.in_transit_encryption = cert_object is not None
        self.security_configuration = emr.CfnSecurityConfiguration(
            self, "SecurityConfiguration",
            security_configuration=emr_config.security_configuration(
                local_disk_key_arn=self.local_disk_key.key_arn,
                tls_certificates_s3_url=tls_certificates_s3_url or None))

        # -- bootstrap assets -------------------------------------------------------------------
        scripts = node_scripts_dir()
        self.efs_mount_script = s3_assets.Asset(
            self, "EfsMountScript", path=str(scripts / EFS_MOUNT_SCRIPT))
        self.metadata_script = s3_assets.Asset(
            self, "MetadataScript", path=str(scripts / METADATA_SCRIPT))
        self.node_scripts = s3_assets.Asset(
            self, "NodeScripts", path=str(scripts), exclude=ASSET_EXCLUDES)

        # -- roles: the nodes' instance role and EMR's service role (emr_roles.py) --------------
        self.cluster_tag = cluster_name or stack.stack_name
        roles = add_emr_roles(
            self, cluster_tag=self.cluster_tag,
            bootstrap_scripts=(self.efs_mount_script, self.metadata_script, self.node_scripts),
            log_objects_arn=self.log_bucket.arn_for_objects(f"{LOG_PREFIX}*"),
            file_system=self.file_system, local_disk_key=self.local_disk_key,
            tls_certificates=cert_object)
        self.instance_role, self.service_role = roles.instance_role, roles.service_role
        self.instance_profile = roles.instance_profile

        # -- the cluster -----------------------------------------------------------------------
        family = image_family(EMR_IMAGE_TYPE)
        image = machine_image or deep_learning_ami(EMR_IMAGE_TYPE)
        self.custom_ami_id = image.get_image(self).image_id
        region = Aws.REGION
        bootstrap_actions = [
            emr.CfnCluster.BootstrapActionConfigProperty(
                name="Mount EFS",
                script_bootstrap_action=emr.CfnCluster.ScriptBootstrapActionConfigProperty(
                    path=self.efs_mount_script.s3_object_url,
                    args=[self.file_system.file_system_id, region, self.efs_mount_point])),
            emr.CfnCluster.BootstrapActionConfigProperty(
                name="Cluster membership",
                script_bootstrap_action=emr.CfnCluster.ScriptBootstrapActionConfigProperty(
                    path=self.metadata_script.s3_object_url,
                    args=["bootstrap", "--scripts-url", self.node_scripts.s3_object_url,
                          "--region", region, "--efs-mount", self.efs_mount_point,
                          "--python", family.python,
                          "--data-checksums", self.data_checksums])),
        ]

        def group(name: str, instance_type: str,
                  count: int) -> emr.CfnCluster.InstanceGroupConfigProperty:
            return emr.CfnCluster.InstanceGroupConfigProperty(
                name=name, instance_count=count, instance_type=instance_type, market="ON_DEMAND")

        self.cluster = emr.CfnCluster(
            self, "Cluster",
            name=self.cluster_tag,
            release_label=self.release_label,
            applications=[emr.CfnCluster.ApplicationProperty(name=a) for a in self.applications],
            custom_ami_id=self.custom_ami_id,
            ebs_root_volume_size=self.root_volume_gib,
            job_flow_role=self.instance_profile.instance_profile_name,
            service_role=self.service_role.role_name,
            log_uri=self.log_uri,
            security_configuration=self.security_configuration.ref,
            visible_to_all_users=True,
            bootstrap_actions=bootstrap_actions,
            steps=emr_config.deploy_time_steps(self.training_command),
            auto_termination_policy=(emr.CfnCluster.AutoTerminationPolicyProperty(
                idle_timeout=int(idle_timeout.to_seconds())) if idle_timeout else None),
            instances=emr.CfnCluster.JobFlowInstancesConfigProperty(
                master_instance_group=group("Primary", primary_type, 1),
                core_instance_group=group("Core", core_type, self.core_instance_count),
                ec2_subnet_id=self.subnet.subnet_id,
                ec2_key_name=key_pair.key_pair_name if key_pair else None,
                emr_managed_master_security_group=self.primary_security_group.security_group_id,
                emr_managed_slave_security_group=self.core_security_group.security_group_id,
                service_access_security_group=(
                    self.service_access_security_group.security_group_id),
                additional_master_security_groups=[g.security_group_id for g in efs_groups],
                additional_slave_security_groups=[g.security_group_id for g in efs_groups],
                keep_job_flow_alive_when_no_steps=True,
                termination_protected=False,
            ),
            tags=[{"key": CLUSTER_TAG_KEY, "value": self.cluster_tag},
                  {"key": EMR_MANAGED_POLICY_TAG, "value": "true"}],
        )
        # Roles and their policies must exist before EMR starts nodes, and the mount targets
        # before the EFS bootstrap action (it also waits for them, for imported file systems).
        # (Only what the template does not reference already: the policies, the mount targets.)
        for role in (self.instance_role, self.service_role):
            policy = role.node.try_find_child("DefaultPolicy")
            if policy is not None:
                self.cluster.node.add_dependency(policy)
        self.cluster.node.add_dependency(self.file_system.mount_targets_available)
        self.cluster_id = self.cluster.ref
        # EMR's rules between its managed groups would fail the groups' deletion.
        self.security_group_release = EmrSecurityGroupRelease(
            self, "SecurityGroupRelease", cluster=self.cluster,
            groups=[self.primary_security_group, self.core_security_group,
                    self.service_access_security_group])

    @property
    def connections(self) -> ec2.Connections:
        """The nodes' connections: ``emr.connections.allow_from(peer, port)`` opens a port on
        the primary and core nodes (e.g. TensorBoard from a notebook host)."""
        return ec2.Connections(
            security_groups=[self.primary_security_group, self.core_security_group])

    def grant_read_logs(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let someone read the cluster's logs (step output, bootstrap action logs)."""
        return self.log_bucket.grant_read(grantee, f"{LOG_PREFIX}*")

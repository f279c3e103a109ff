"""EmrDeepLearningCluster: an EMR cluster on the Deep Learning AMI, with EFS and membership.

What the original (seed 000) did by hand, as one construct: EMR with the DLAMI as a custom
AMI, EFS mounted at /efs by a bootstrap action, the workers file and ``DEEPLEARNING_*``
environment on EVERY node (rendered by ``bootstrap_scripts.membership``, the same renderer
as the EC2 cluster's node agent; nothing is copied by hand), and ``dl-run`` as an EMR step.
See docs/emr.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aws_cdk import Aws, Duration, RemovalPolicy, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_emr as emr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from bootstrap_scripts.submit import dl_run_step
from constructs_lib import validation
from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY
from constructs_lib.images import deep_learning_ami, image_family
from constructs_lib.network import DEFAULT_VPC_CIDR, ClusterNetwork
from constructs_lib.package_paths import ASSET_EXCLUDES, node_scripts_dir
from constructs_lib.shared_storage import DEFAULT_MOUNT_POINT, SharedFileSystem

#: A current EMR 7 release. EMR 7 custom AMIs must be based on Amazon Linux 2023.
DEFAULT_RELEASE_LABEL = "emr-7.12.0"
DEFAULT_INSTANCE_TYPE = "g5.xlarge"
DEFAULT_ROOT_VOLUME_GIB = 100
#: Minimal: YARN/HDFS only. Training runs through dl-run, not through an EMR application.
DEFAULT_APPLICATIONS: tuple[str, ...] = ("Hadoop",)
#: The DLAMI family EMR accepts: EMR 7.x custom AMIs must be Amazon Linux 2023 based.
EMR_IMAGE_TYPE = "amazon-linux-2023"
#: Tag the EMR managed service policy v2 requires on the VPC, subnets and security groups
#: it may use; without it EMR cannot place the cluster (AccessDenied on RunInstances).
EMR_MANAGED_POLICY_TAG = "for-use-with-amazon-emr-managed-policies"
LOG_PREFIX = "emr-logs/"

#: Applications offered by EMR 7.x releases (canonical spelling; matching is case-blind).
EMR7_APPLICATIONS: tuple[str, ...] = (
    "AmazonCloudWatchAgent", "Delta", "Flink", "HBase", "HCatalog", "Hadoop", "Hive", "Hudi",
    "Hue", "Iceberg", "JupyterEnterpriseGateway", "JupyterHub", "Livy", "Oozie", "Phoenix",
    "Pig", "Presto", "Spark", "TensorFlow", "Tez", "Trino", "Zeppelin", "ZooKeeper",
)
#: Applications that made the original's cluster fail to start, and why.
UNSTABLE_APPLICATIONS: dict[str, str] = {
    "Hue": ("Hue failed to start on the Deep Learning AMI (its service expects the stock EMR "
            "AMI's Python and database packages), which failed the whole cluster start"),
    "Zeppelin": ("Zeppelin failed to start on the Deep Learning AMI (its interpreter setup "
                 "collides with the AMI's Python/conda environments), which failed the whole "
                 "cluster start"),
}

_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
_RELEASE_LABEL = re.compile(r"^emr-(\d+)\.(\d+)\.(\d+)$")
_S3_URL = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(.+)$")


def _instance_type(name: str, value: str) -> str:
    if not _INSTANCE_TYPE.match(str(value)):
        raise validation.ConfigError(
            f"'{name}' must be an EC2 instance type like g5.xlarge, got {value!r}")
    return str(value)


def _release_label(value: str) -> str:
    match = _RELEASE_LABEL.match(str(value))
    if not match:
        raise validation.ConfigError(
            f"'release_label' must look like emr-7.12.0, got {value!r}")
    if int(match.group(1)) < 7:
        raise validation.ConfigError(
            f"'release_label' must be an emr-7.x release or later (the construct uses an "
            f"Amazon Linux 2023 Deep Learning AMI, which EMR supports from 7.0), got {value!r}")
    return str(value)


def check_applications(applications: Sequence[str], *, allow_unstable: bool) -> list[str]:
    """Canonical application names; unknown names and (unless allowed) Hue/Zeppelin refused."""
    if isinstance(applications, str):
        raise validation.ConfigError(
            f"'applications' must be a list of names, got the string {applications!r}")
    known = {a.lower(): a for a in EMR7_APPLICATIONS}
    result: list[str] = []
    for raw in applications:
        name = known.get(str(raw).strip().lower())
        if name is None:
            raise validation.ConfigError(
                f"'applications' contains {raw!r}, which is not an EMR 7 application; "
                f"expected some of: {', '.join(EMR7_APPLICATIONS)}")
        if name in UNSTABLE_APPLICATIONS and not allow_unstable:
            raise validation.ConfigError(
                f"'applications' contains {name!r}: {UNSTABLE_APPLICATIONS[name]}. Leave it "
                "out, or pass allow_unstable_applications=True (context "
                "emrAllowUnstableApplications=true) if you have checked it starts on your AMI")
        if name not in result:
            result.append(name)
    return result


def _s3_url(name: str, value: str) -> tuple[str, str]:
    match = _S3_URL.match(str(value))
    if not match:
        raise validation.ConfigError(
            f"'{name}' must be an S3 object URL like s3://my-bucket/certs/emr-tls.zip, "
            f"got {value!r}")
    return match.group(1), match.group(2)


class EmrDeepLearningCluster(Construct):
    """An EMR cluster for distributed training on the Deep Learning AMI.

    All props are keyword-only; defaults (docs/emr.md "Props and defaults"):
    a new VPC (10.0.0.0/16, private subnets with NAT, flow logs) unless ``vpc`` is given;
    release ``emr-7.12.0``; applications ``["Hadoop"]``; one ``g5.xlarge`` primary and two
    ``g5.xlarge`` core nodes in uniform instance groups; the PyTorch DLAMI for Amazon Linux
    2023 from its public SSM parameter (or ``ami_id``); 100 GiB root volume (minimum 50);
    a new encrypted, TLS-only EFS at /efs (or ``file_system`` / ``efs_file_system_id``); the
    first private subnet; no key pair (SSM Session Manager); a new encrypted, TLS-only,
    private S3 log bucket; at-rest encryption (SSE-S3 for EMRFS, KMS for local disks and EBS)
    and IMDSv2 in a security configuration, in-transit encryption only with
    ``tls_certificates_s3_url``; no training step; no idle auto-termination.

    Every node runs two bootstrap actions: ``emr_efs_mount.sh <fs-id> <region> <mount>``
    and ``emr_metadata.py bootstrap ...``, which unpacks the node scripts, installs
    ``dl-run`` and the job executor, and starts the watcher that writes the workers file,
    hostfiles and ``DEEPLEARNING_*`` environment from ``ListInstances`` on every node.
    """

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
        primary_instance_type: str = DEFAULT_INSTANCE_TYPE,
        core_instance_type: str = DEFAULT_INSTANCE_TYPE,
        core_instance_count: int = 2,
        ami_id: str | None = None,
        root_volume_gib: int = DEFAULT_ROOT_VOLUME_GIB,
        file_system: efs.IFileSystem | None = None,
        efs_file_system_id: str | None = None,
        efs_security_group: ec2.ISecurityGroup | None = None,
        efs_mount_point: str = DEFAULT_MOUNT_POINT,
        log_bucket: s3.IBucket | None = None,
        tls_certificates_s3_url: str | None = None,
        key_name: str | None = None,
        cluster_name: str | None = None,
        training_command: Sequence[str] | None = None,
        idle_timeout: Duration | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        # -- validation: every bad prop fails synth with its name and value ----------------------
        self.release_label = _release_label(release_label)
        self.applications = check_applications(
            applications, allow_unstable=allow_unstable_applications)
        _instance_type("primary_instance_type", primary_instance_type)
        _instance_type("core_instance_type", core_instance_type)
        self.core_instance_count = validation.positive_int(
            "core_instance_count", core_instance_count)
        self.root_volume_gib = validation.root_volume("root_volume_gib", root_volume_gib)
        if ami_id:
            validation.ami_id("ami_id", ami_id)
        validation.mount_point("efs_mount_point", efs_mount_point)
        if file_system is not None and efs_file_system_id:
            raise validation.ConfigError(
                "give either 'file_system' or 'efs_file_system_id', not both")
        if file_system is not None and efs_security_group is not None:
            raise validation.ConfigError(
                "'efs_security_group' is only for 'efs_file_system_id'; a 'file_system' "
                "brings its own security groups")
        cert_object = (_s3_url("tls_certificates_s3_url", tls_certificates_s3_url)
                       if tls_certificates_s3_url else None)
        if training_command is not None and (isinstance(training_command, str)
                                             or not list(training_command)):
            raise validation.ConfigError(
                "'training_command' must be a non-empty list of arguments such as "
                f"['python', 'train.py'], got {training_command!r}")
        if idle_timeout is not None and not idle_timeout.is_unresolved() and not (
                60 <= idle_timeout.to_seconds() <= 7 * 24 * 3600):
            raise validation.ConfigError(
                "'idle_timeout' must be between 1 minute and 7 days, got "
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
                    "the VPC has no private subnets with egress; pass 'subnet' explicitly")
            subnet = private[0]
        self.subnet = subnet
        if vpc is None:
            # Our own VPC: tag it so EMR's managed policy v2 may place the cluster in it.
            Tags.of(self.network).add(EMR_MANAGED_POLICY_TAG, "true")

        if file_system is not None:
            self.storage: SharedFileSystem | None = None
            self.file_system: efs.IFileSystem = file_system
            self.efs_mount_point = validation.mount_point("efs_mount_point", efs_mount_point)
            efs_groups = list(file_system.connections.security_groups)
        else:
            self.storage = SharedFileSystem(
                self, "SharedStorage", vpc=self.vpc, file_system_id=efs_file_system_id,
                security_group=efs_security_group, mount_point=efs_mount_point)
            self.file_system = self.storage.file_system
            self.efs_mount_point = self.storage.mount_point
            efs_groups = [self.storage.security_group]
        if not efs_groups:
            raise validation.ConfigError(
                "the file system has no security group to attach to the EMR nodes")
        self.efs_security_groups = efs_groups
        # As in the original: the EFS group goes on the nodes as an additional group, and
        # lets its own members reach NFS.
        for group in efs_groups:
            group.connections.allow_internally(ec2.Port.tcp(2049),
                                               "NFS from EMR nodes carrying this group")
        self.file_system_arn = stack.format_arn(
            service="elasticfilesystem", resource="file-system",
            resource_name=self.file_system.file_system_id)

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
            self.log_bucket: s3.IBucket = s3.Bucket(
                self, "LogBucket", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL, versioned=False,
                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                removal_policy=RemovalPolicy.RETAIN)
        else:
            self.log_bucket = log_bucket
        self.log_uri = f"s3://{self.log_bucket.bucket_name}/{LOG_PREFIX}"

        self.local_disk_key = kms.Key(
            self, "LocalDiskKey", enable_key_rotation=True, removal_policy=RemovalPolicy.RETAIN,
            description="EMR local disk and EBS encryption of the deep-learning cluster")
        encryption: dict = {
            "EnableAtRestEncryption": True,
            "AtRestEncryptionConfiguration": {
                "S3EncryptionConfiguration": {"EncryptionMode": "SSE-S3"},
                "LocalDiskEncryptionConfiguration": {
                    "EncryptionKeyProviderType": "AwsKms",
                    "AwsKmsKey": self.local_disk_key.key_arn,
                    "EnableEbsEncryption": True,
                },
            },
            "EnableInTransitEncryption": cert_object is not None,
        }
        if tls_certificates_s3_url:
            encryption["InTransitEncryptionConfiguration"] = {
                "TLSCertificateConfiguration": {
                    "CertificateProviderType": "PEM", "S3Object": tls_certificates_s3_url}}
        self.in_transit_encryption = cert_object is not None
        self.security_configuration = emr.CfnSecurityConfiguration(
            self, "SecurityConfiguration",
            security_configuration={
                "EncryptionConfiguration": encryption,
                "InstanceMetadataServiceConfiguration": {
                    "MinimumInstanceMetadataServiceVersion": 2,
                    "HttpPutResponseHopLimit": 2,
                },
            })

        # -- bootstrap assets -------------------------------------------------------------------
        scripts = node_scripts_dir()
        self.efs_mount_script = s3_assets.Asset(
            self, "EfsMountScript", path=str(scripts / "emr_efs_mount.sh"))
        self.metadata_script = s3_assets.Asset(
            self, "MetadataScript", path=str(scripts / "emr_metadata.py"))
        self.node_scripts = s3_assets.Asset(
            self, "NodeScripts", path=str(scripts), exclude=ASSET_EXCLUDES)

        # -- roles ------------------------------------------------------------------------------
        self.cluster_tag = cluster_name or stack.stack_name
        self.instance_role = iam.Role(
            self, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="EMR nodes of the deep-learning cluster (least privilege)",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
                "AmazonSSMManagedInstanceCore")])
        self.instance_profile = iam.InstanceProfile(
            self, "InstanceProfile", role=self.instance_role)
        self._grant_node_access(cert_object)

        self.service_role = iam.Role(
            self, "ServiceRole", assumed_by=iam.ServicePrincipal("elasticmapreduce.amazonaws.com"),
            description="EMR service role of the deep-learning cluster",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
                "service-role/AmazonEMRServicePolicy_v2")])
        # Policy v2 only passes roles named EMR_EC2_DefaultRole: pass exactly ours instead.
        self.service_role.add_to_principal_policy(iam.PolicyStatement(
            sid="PassInstanceRole", actions=["iam:PassRole"],
            resources=[self.instance_role.role_arn],
            conditions={"StringLike": {"iam:PassedToService": "ec2.amazonaws.com*"}}))
        # EBS encryption with our key: EMR creates grants for the volumes it attaches.
        self.service_role.add_to_principal_policy(iam.PolicyStatement(
            sid="EncryptNodeVolumes",
            actions=["kms:CreateGrant", "kms:DescribeKey", "kms:GenerateDataKeyWithoutPlaintext",
                     "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:Decrypt"],
            resources=[self.local_disk_key.key_arn]))

        # -- the cluster -----------------------------------------------------------------------
        family = image_family(EMR_IMAGE_TYPE)
        self.custom_ami_id = deep_learning_ami(EMR_IMAGE_TYPE, ami_id=ami_id).get_image(
            self).image_id
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
                          "--python", family.python])),
        ]
        steps = None
        if training_command is not None:
            spec = dl_run_step(list(training_command), name="dl-run (deploy-time training)")
            jar = spec["HadoopJarStep"]
            steps = [emr.CfnCluster.StepConfigProperty(
                name=spec["Name"], action_on_failure=spec["ActionOnFailure"],
                hadoop_jar_step=emr.CfnCluster.HadoopJarStepConfigProperty(
                    jar=jar["Jar"], args=jar["Args"]))]
        self.training_command = list(training_command) if training_command else None

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
            steps=steps,
            auto_termination_policy=(emr.CfnCluster.AutoTerminationPolicyProperty(
                idle_timeout=int(idle_timeout.to_seconds())) if idle_timeout else None),
            instances=emr.CfnCluster.JobFlowInstancesConfigProperty(
                master_instance_group=group("Primary", primary_instance_type, 1),
                core_instance_group=group("Core", core_instance_type, self.core_instance_count),
                ec2_subnet_id=self.subnet.subnet_id,
                ec2_key_name=key_name,
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
        for child in self.file_system.node.children:
            if isinstance(child, efs.CfnMountTarget) or child.node.id.startswith("EfsMountTarget"):
                self.cluster.node.add_dependency(child)
        self.cluster_id = self.cluster.ref

    def _grant_node_access(self, cert_object: tuple[str, str] | None) -> None:
        """What the bootstrap actions, the membership watcher and EMR's log pusher need."""
        role = self.instance_role
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReadBootstrapScripts", actions=["s3:GetObject"],
            resources=[a.bucket.arn_for_objects(a.s3_object_key) for a in
                       (self.efs_mount_script, self.metadata_script, self.node_scripts)]))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="WriteClusterLogs", actions=["s3:PutObject"],
            resources=[self.log_bucket.arn_for_objects(f"{LOG_PREFIX}*")]))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="WaitForSharedFileSystem",
            actions=["elasticfilesystem:DescribeFileSystems",
                     "elasticfilesystem:DescribeMountTargets"],
            resources=[self.file_system_arn]))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="MountSharedFileSystem",
            actions=["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite",
                     "elasticfilesystem:ClientRootAccess"],
            resources=[self.file_system_arn]))
        # The cluster id is only known after creation; the tag limits this to our cluster.
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="ListOwnClusterInstances",
            actions=["elasticmapreduce:ListInstances", "elasticmapreduce:DescribeCluster"],
            resources=[Stack.of(self).format_arn(service="elasticmapreduce",
                                                 resource="cluster", resource_name="*")],
            conditions={"StringEquals": {
                f"elasticmapreduce:ResourceTag/{CLUSTER_TAG_KEY}": self.cluster_tag}}))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="GpuCountsOfInstanceTypes", actions=["ec2:DescribeInstanceTypes"],
            resources=["*"]))  # no resource-level permissions for this read-only API
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="LocalDiskEncryption",
            actions=["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
            resources=[self.local_disk_key.key_arn]))
        if cert_object is not None:
            bucket, key = cert_object
            role.add_to_principal_policy(iam.PolicyStatement(
                sid="ReadTlsCertificates", actions=["s3:GetObject"],
                resources=[Stack.of(self).format_arn(
                    service="s3", region="", account="", resource=bucket, resource_name=key)]))

    @property
    def connections(self) -> ec2.Connections:
        """The nodes' connections: ``emr.connections.allow_from(peer, port)`` opens a port on
        the primary and core nodes (e.g. TensorBoard from a notebook host)."""
        return ec2.Connections(
            security_groups=[self.primary_security_group, self.core_security_group])

    def grant_read_logs(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let someone read the cluster's logs (step output, bootstrap action logs)."""
        return self.log_bucket.grant_read(grantee, f"{LOG_PREFIX}*")

"""DeepLearningCluster: network, EFS, queues, capacity adjuster, master and worker groups."""

from __future__ import annotations

from aws_cdk import Aws, CfnWaitCondition, CfnWaitConditionHandle, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from constructs_lib import validation
from constructs_lib.capacity_adjuster import CapacityAdjuster, this_clusters_groups
from constructs_lib.images import DEFAULT_IMAGE_TYPE, deep_learning_ami, image_family
from constructs_lib.metadata_queues import MetadataQueues
from constructs_lib.network import DEFAULT_VPC_CIDR, ClusterNetwork
from constructs_lib.node_group import DEFAULT_ROOT_VOLUME_GIB, NodeGroup
from constructs_lib.package_paths import ASSET_EXCLUDES, node_scripts_dir
from constructs_lib.shared_storage import DEFAULT_MOUNT_POINT, SharedFileSystem
from constructs_lib.user_data import render_bootstrap_commands

DEFAULT_INSTANCE_TYPE = "g5.xlarge"
SETUP_TIMEOUT_SECONDS = 3300  # the original's 55 minutes


def _command_line(name: str, value: object) -> str:
    """A command (or script path) the nodes run: one non-empty line without NUL, since it
    travels as one argument through the user data and a systemd ExecStart line."""
    if isinstance(value, str) and Token.is_unresolved(value):
        return value
    text = value.strip() if isinstance(value, str) else ""
    if not text or any(c in text for c in "\n\r\x00"):
        raise validation.ConfigError(
            f"'{name}' must be one non-empty line (a command or a script path), got {value!r}"
        )
    return text


class DeepLearningCluster(Construct):
    """A distributed-training cluster: one master and ``worker_count`` workers.

    All props are keyword-only; every one has a default (see README "DeepLearningCluster"):
    a new VPC (10.0.0.0/16), 2 workers, g5.xlarge master and workers, the PyTorch Deep
    Learning AMI for Ubuntu, a new encrypted EFS at /efs, no SSH ingress (use SSM Session
    Manager), no key pair, 100 GiB encrypted gp3 root volumes, no placement group, no EFA.

    The master also trains (rank 0), as in the original template. Nodes live in one AZ's
    private subnet (lowest latency, and a cluster placement group needs a single AZ); the
    master moves to that AZ's public subnet only when ``ssh_cidr`` is given.

    Elastic training (docs/elastic.md): ``max_workers`` (default ``worker_count +
    spot_workers``) is the worker group's maximum, the ceiling of ``dl-scale --workers``;
    ``spot_workers`` (default 0) adds that many Spot workers above the ``worker_count``
    on-demand base; ``data_prep_script`` (default none) is a command every node runs before
    it joins. The worker group has a termination lifecycle hook (``drain``) so leaving
    workers are drained, and the master agent protects itself and the ``worker_count`` base
    workers from scale-in.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc | None = None,
        vpc_cidr: str = DEFAULT_VPC_CIDR,
        worker_count: int = 2,
        min_workers: int = 1,
        max_workers: int | None = None,
        worker_instance_type: str = DEFAULT_INSTANCE_TYPE,
        master_instance_type: str = DEFAULT_INSTANCE_TYPE,
        machine_image: ec2.IMachineImage | None = None,
        image_type: str = DEFAULT_IMAGE_TYPE,
        ami_id: str | None = None,
        root_device_name: str | None = None,
        file_system: efs.IFileSystem | None = None,
        efs_file_system_id: str | None = None,
        efs_security_group: ec2.ISecurityGroup | None = None,
        efs_mount_point: str = DEFAULT_MOUNT_POINT,
        efs_require_tls: bool = True,
        ssh_cidr: str | None = None,
        key_name: str | None = None,
        root_volume_gib: int = DEFAULT_ROOT_VOLUME_GIB,
        placement_group: bool | ec2.IPlacementGroup = False,
        efa: bool = False,
        cluster_id: str | None = None,
        setup_timeout_seconds: int = SETUP_TIMEOUT_SECONDS,
        spot_workers: int = 0,
        data_prep_script: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        worker_count = validation.positive_int("worker_count", worker_count)
        min_workers = validation.positive_int("min_workers", min_workers, minimum=0)
        spot_workers = validation.positive_int("spot_workers", spot_workers, minimum=0)
        desired_workers = worker_count + spot_workers
        max_workers = (
            desired_workers
            if max_workers is None
            else validation.positive_int("max_workers", max_workers)
        )
        if not min_workers <= worker_count <= desired_workers <= max_workers:
            raise validation.ConfigError(
                f"workers must satisfy min_workers <= worker_count <= worker_count + "
                f"spot_workers <= max_workers, got {min_workers} <= {worker_count} <= "
                f"{desired_workers} <= {max_workers}"
            )
        if data_prep_script is not None:
            data_prep_script = _command_line("data_prep_script", data_prep_script)
        root_volume_gib = validation.root_volume("root_volume_gib", root_volume_gib)
        family = image_family(image_type)
        if ami_id:
            validation.ami_id("ami_id", ami_id)
        if ssh_cidr:
            validation.ssh_cidr("ssh_cidr", ssh_cidr)
        if file_system is not None and efs_file_system_id:
            raise validation.ConfigError(
                "give either 'file_system' or 'efs_file_system_id', not both"
            )
        self.cluster_id = cluster_id or Stack.of(self).stack_name
        self.worker_count = worker_count
        self.spot_workers = spot_workers
        self.max_workers = max_workers
        self.data_prep_script = data_prep_script

        # -- network, storage, queues --------------------------------------------------------
        self.network = ClusterNetwork(self, "Network", vpc=vpc, cidr=vpc_cidr)
        self.vpc = self.network.vpc
        private = self.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets
        if not private:
            raise validation.ConfigError("the VPC has no private subnets with egress for the nodes")
        node_subnets = ec2.SubnetSelection(subnets=[private[0]])
        master_subnets = node_subnets
        if ssh_cidr:
            public = [
                s
                for s in self.vpc.public_subnets
                if s.availability_zone == private[0].availability_zone
            ] or self.vpc.public_subnets
            if not public:
                raise validation.ConfigError("'ssh_cidr' needs a public subnet for the master")
            master_subnets = ec2.SubnetSelection(subnets=[public[0]])

        if file_system is not None:
            self.storage = None
            self.file_system: efs.IFileSystem = file_system
            self.efs_mount_point = validation.mount_point("efs_mount_point", efs_mount_point)
        else:
            self.storage = SharedFileSystem(
                self,
                "SharedStorage",
                vpc=self.vpc,
                file_system_id=efs_file_system_id,
                security_group=efs_security_group,
                mount_point=efs_mount_point,
                require_tls=efs_require_tls,
            )
            self.file_system = self.storage.file_system
            self.efs_mount_point = self.storage.mount_point

        # Built from the id rather than GetAtt: the same ARN, and it also works for an imported
        # file system and on CloudFormation emulators that lack EFS attributes.
        self.file_system_arn = Stack.of(self).format_arn(
            service="elasticfilesystem",
            resource="file-system",
            resource_name=self.file_system.file_system_id,
        )

        self.queues = MetadataQueues(self, "MetadataQueues")
        self.master_queue = self.queues.master_queue
        self.worker_queue = self.queues.worker_queue

        self.capacity_adjuster = CapacityAdjuster(
            self, "CapacityAdjuster", cluster_id=self.cluster_id, master_queue=self.master_queue
        )
        self.topic = self.capacity_adjuster.topic
        self.capacity_function = self.capacity_adjuster.function

        # -- security groups: nodes talk freely to each other, nothing else gets in -----------
        self.node_security_group = ec2.SecurityGroup(
            self,
            "NodeSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=True,
            description="Cluster nodes: all traffic between nodes (NCCL, MPI, rendezvous)",
        )
        self.node_security_group.add_ingress_rule(
            self.node_security_group, ec2.Port.all_traffic(), "all traffic between cluster nodes"
        )
        master_groups: list[ec2.ISecurityGroup] = [self.node_security_group]
        self.admin_security_group: ec2.SecurityGroup | None = None
        if ssh_cidr:
            self.admin_security_group = ec2.SecurityGroup(
                self,
                "AdminSsh",
                vpc=self.vpc,
                allow_all_outbound=False,
                description=f"SSH to the master from {ssh_cidr} only",
            )
            self.admin_security_group.add_ingress_rule(
                ec2.Peer.ipv4(ssh_cidr), ec2.Port.tcp(22), "SSH from the administrators' range"
            )
            master_groups.append(self.admin_security_group)
        self.file_system.connections.allow_default_port_from(
            self.node_security_group, "NFS from cluster nodes"
        )

        # -- node scripts and the setup wait condition -----------------------------------------
        self.node_scripts = s3_assets.Asset(
            self, "NodeScripts", path=str(node_scripts_dir()), exclude=ASSET_EXCLUDES
        )
        self.wait_handle = CfnWaitConditionHandle(self, "SetupHandle")

        image = machine_image or deep_learning_ami(image_type, ami_id=ami_id)
        device = root_device_name or family.root_device_name
        pg: ec2.IPlacementGroup | None = None
        if placement_group is True:
            pg = ec2.PlacementGroup(
                self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER
            )
        elif placement_group:
            pg = placement_group  # type: ignore[assignment]
        self.placement_group = pg

        def user_data(role: str, wait_handle: str) -> ec2.UserData:
            settings = {
                "role": role,
                "cluster-id": self.cluster_id,
                "stack-name": Aws.STACK_NAME,
                "region": Aws.REGION,
                "master-queue-url": self.master_queue.queue_url,
                "worker-queue-url": self.worker_queue.queue_url,
                "efs-id": self.file_system.file_system_id,
                "mount-point": self.efs_mount_point,
                "wait-handle": wait_handle,
                "setup-timeout": str(setup_timeout_seconds),
            }
            if role == "master":  # only the master decides who is a protected base worker
                settings["base-workers"] = str(worker_count)
            if data_prep_script:
                settings["data-prep"] = data_prep_script
            data = ec2.UserData.for_linux()
            data.add_commands(
                *render_bootstrap_commands(
                    asset_s3_url=self.node_scripts.s3_object_url,
                    python=family.python,
                    agent_settings=settings,
                )
            )
            return data

        common = dict(
            cluster_id=self.cluster_id,
            vpc=self.vpc,
            machine_image=image,
            notification_topic=self.topic,
            root_device_name=device,
            root_volume_gib=root_volume_gib,
            key_name=key_name,
            placement_group=pg,
            efa=efa,
        )
        self.master_group = NodeGroup(
            self,
            "MasterGroup",
            role="master",
            vpc_subnets=master_subnets,
            instance_type=ec2.InstanceType(master_instance_type),
            user_data=user_data("master", self.wait_handle.ref),
            security_groups=master_groups,
            min_capacity=1,
            max_capacity=1,
            desired_capacity=1,
            associate_public_ip=bool(ssh_cidr),
            **common,
        )
        self.worker_group = NodeGroup(
            self,
            "WorkerGroup",
            role="worker",
            vpc_subnets=node_subnets,
            instance_type=ec2.InstanceType(worker_instance_type),
            user_data=user_data("worker", ""),
            security_groups=[self.node_security_group],
            min_capacity=min_workers,
            max_capacity=max_workers,
            desired_capacity=desired_workers,
            spot_capacity=spot_workers,
            **common,
        )
        # Leaving workers are drained first (protocol.md §7).
        self.drain_hook = self.worker_group.add_drain_hook(self.topic)
        self.drain_hook.node.add_dependency(self.capacity_adjuster)
        self._grant_elastic_control(self.master_group.role)
        for group in (self.master_group, self.worker_group):
            self._grant_node_access(group.role)
            # The subscription must exist before the first launch notification is sent.
            group.auto_scaling_group.node.add_dependency(self.capacity_adjuster)
        # As in the original: workers are created after the master group.
        self.worker_group.auto_scaling_group.node.add_dependency(
            self.master_group.auto_scaling_group
        )

        self.wait_condition = CfnWaitCondition(
            self,
            "SetupComplete",
            handle=self.wait_handle.ref,
            count=1,
            timeout=str(setup_timeout_seconds),
        )
        self.wait_condition.node.add_dependency(self.master_group.auto_scaling_group)

    def _grant_node_access(self, role: iam.IRole) -> None:
        """What the node agent, job executor and health check need, and no more."""
        self.queues.grant_agent_access(role)
        # Exactly the one object (asset.grant_read would allow GetObject* on the whole bucket).
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ReadNodeScripts",
                actions=["s3:GetObject"],
                resources=[
                    self.node_scripts.bucket.arn_for_objects(self.node_scripts.s3_object_key)
                ],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="MountSharedFileSystem",
                actions=[
                    "elasticfilesystem:ClientMount",
                    "elasticfilesystem:ClientWrite",
                    "elasticfilesystem:ClientRootAccess",
                ],
                resources=[self.file_system_arn],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="DiscoverClusterMembers",
                actions=["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances"],
                resources=["*"],  # these Describe APIs support no resource-level permissions
            )
        )

    def _grant_elastic_control(self, role: iam.IRole) -> None:
        """The master agent completes drains and sets scale-in protection; ``dl-scale`` (run
        on the master) changes capacity and removes workers. Only this cluster's groups:
        the same tag condition as the capacity adjuster's (protocol.md §1)."""
        role.add_to_principal_policy(
            this_clusters_groups(
                self,
                sid="ElasticMembershipOfThisCluster",
                cluster_id=self.cluster_id,
                actions=[
                    "autoscaling:CompleteLifecycleAction",
                    "autoscaling:SetInstanceProtection",
                    "autoscaling:SetDesiredCapacity",
                    "autoscaling:TerminateInstanceInAutoScalingGroup",
                ],
            )
        )

    @property
    def connections(self) -> ec2.Connections:
        """The nodes' connections: ``cluster.connections.allow_from(peer, port)`` opens a port
        on every node (for example a notebook host reaching TensorBoard)."""
        return ec2.Connections(security_groups=[self.node_security_group])

"""One Auto Scaling group of cluster nodes (the master group, or the worker group)."""

from __future__ import annotations

from collections.abc import Sequence

import jsii
from aws_cdk import Duration, Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_autoscaling_hooktargets as hooktargets
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sns as sns
from constructs import Construct

from constructs_lib import efa as efa_layout
from constructs_lib import launch, validation
from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY, ROLE_TAG_KEY

#: Node types and the ``NodeType`` tag value of each.
NODE_TYPES = {"master": "Master", "worker": "Worker"}
#: Size of the encrypted gp3 root volume of every node.
DEFAULT_ROOT_VOLUME_GIB = 100
#: Root device of the default machine image (the Ubuntu Deep Learning AMI).
DEFAULT_ROOT_DEVICE_NAME = "/dev/sda1"
#: Name of the worker group's termination lifecycle hook (docs/protocol.md, "Elastic
#: membership": the master agent completes it once the leaving worker is drained).
DRAIN_HOOK_NAME = "drain"
#: Seconds a terminating instance may wait for its drain (then Auto Scaling CONTINUEs).
DRAIN_HEARTBEAT_SECONDS = 300


@jsii.implements(ec2.IConnectable)
class NodeGroup(Construct):
    """An Auto Scaling group of cluster nodes (the master group, or the worker group) from a
    launch template, secure by default.

    IMDSv2 is required (hop limit 2 so containers on the node still reach it), the root
    volume is encrypted gp3, the group and its instances carry the tags
    ``NodeType=Master|Worker`` and ``dl-cluster:id``, and all four Auto Scaling
    notifications (launch, launch error, terminate, terminate error) go to
    ``notification_topic``.

    With ``spot_capacity`` the group uses a mixed instances policy whose on-demand base is
    ``desired_capacity - spot_capacity`` (0 % on-demand above it, price-capacity-optimized
    Spot) and capacity rebalancing, so an at-risk Spot instance is replaced and then
    terminated through the group, which runs its termination lifecycle hook (a drain) like
    any scale-in.

    With ``fallback_instance_types`` the group also uses a mixed instances policy: one
    override per type, ``instance_type`` first, and the ``prioritized`` On-Demand allocation
    strategy, so Auto Scaling launches the first type that has capacity (README "When
    capacity is short").
    """

    @validation.reports_path
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        node_type: str,
        cluster_id: str,
        vpc: ec2.IVpc,
        vpc_subnets: ec2.SubnetSelection,
        instance_type: ec2.InstanceType | str,
        machine_image: ec2.IMachineImage,
        user_data: ec2.UserData,
        security_groups: Sequence[ec2.ISecurityGroup],
        notification_topic: sns.ITopic,
        min_capacity: int,
        max_capacity: int,
        desired_capacity: int,
        role: iam.IRole | None = None,
        root_device_name: str = DEFAULT_ROOT_DEVICE_NAME,
        root_volume_gib: int = DEFAULT_ROOT_VOLUME_GIB,
        key_pair: ec2.IKeyPair | None = None,
        placement_group: ec2.IPlacementGroup | None = None,
        efa: bool = False,
        efa_cards: Sequence[int] | None = None,
        associate_public_ip: bool = False,
        spot_capacity: int = 0,
        fallback_instance_types: Sequence[str] = (),
        group_placement_group: ec2.IPlacementGroup | None = None,
        capacity: launch.Capacity | None = None,
    ) -> None:
        """
        :param node_type: ``master`` or ``worker``: the ``NodeType`` tag and the role's
            description.
        :param cluster_id: the cluster's ``dl-cluster:id`` tag value.
        :param vpc: the VPC of the group.
        :param vpc_subnets: where the instances start.
        :param instance_type: instance type of the nodes (``ec2.InstanceType`` or its name).
        :param machine_image: the nodes' AMI.
        :param user_data: the nodes' boot script.
        :param security_groups: the nodes' groups (at least one).
        :param notification_topic: receives the group's Auto Scaling notifications.
        :param min_capacity: the group's minimum size.
        :param max_capacity: the group's maximum size.
        :param desired_capacity: the group's size at deployment.
        :param role: the instance role; grants the cluster makes are added to it.
            :default: a new role with SSM Session Manager core access
                (``AmazonSSMManagedInstanceCore``) and nothing else
        :param root_device_name: the AMI's root device, which gets the root volume.
            :default: ``/dev/sda1`` (the Ubuntu Deep Learning AMI's)
        :param root_volume_gib: size of the encrypted gp3 root volume, at least 50.
            :default: 100
        :param key_pair: EC2 key pair for SSH.
            :default: none (use SSM Session Manager)
        :param placement_group: every instance starts in this placement group.
            :default: none
        :param efa: give the launch template an EFA interface on every EFA network card of
            the instance type (``constructs_lib.efa``: p5.48xlarge gets 32); the type must
            support EFA, and fallback types must have the same cards.
            :default: False
        :param efa_cards: with ``efa``, the network card indexes that get an EFA interface,
            instead of the instance type's (``constructs_lib.efa.EFA_CARDS``).
            :default: the instance type's EFA cards (one, card 0, for a type not in the table)
        :param associate_public_ip: give the instances a public address (needs a public
            subnet).
            :default: False
        :param spot_capacity: how many of ``desired_capacity`` run on Spot.
            :default: 0 (all on-demand)
        :param fallback_instance_types: types to launch, in this order, when
            ``instance_type`` has no capacity (a prioritized mixed instances policy).
            :default: none (``instance_type`` only)
        :param group_placement_group: the group's own placement group (the group's
            ``PlacementGroup``, which UpdateAutoScalingGroup can change when the capacity
            adjuster moves the group to another zone); not with ``placement_group``.
            :default: none
        :param capacity: a Capacity Reservation, reservation group or Capacity Block the
            launch template targets (``constructs_lib.launch.Capacity``).
            :default: none (On-Demand capacity)
        """
        super().__init__(scope, construct_id)
        if node_type not in NODE_TYPES:
            raise validation.ConfigError(f"node_type must be master or worker, got {node_type!r}")
        validation.root_volume("root_volume_gib", root_volume_gib)
        if not 0 <= min_capacity <= desired_capacity <= max_capacity:
            raise validation.ConfigError(
                f"capacities must satisfy 0 <= min <= desired <= max, got min={min_capacity} "
                f"desired={desired_capacity} max={max_capacity}"
            )
        if not 0 <= spot_capacity <= desired_capacity:
            raise validation.ConfigError(
                f"spot_capacity must be between 0 and desired_capacity ({desired_capacity}), "
                f"got {spot_capacity}"
            )
        if not security_groups:
            raise validation.ConfigError("security_groups must name at least one group")
        if placement_group is not None and group_placement_group is not None:
            raise validation.ConfigError(
                "give placement_group or group_placement_group, not both")
        primary_type = validation.instance_type("instance_type", instance_type)
        self.instance_types = validation.instance_types(
            "fallback_instance_types", [primary_type, *fallback_instance_types])
        self.node_type = node_type

        self.role: iam.IRole = role or iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")
            ],
            description=f"{NODE_TYPES[node_type]} nodes of cluster {cluster_id}",
        )
        primary_sg, *extra_sgs = security_groups
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            instance_type=ec2.InstanceType(primary_type),
            machine_image=machine_image,
            user_data=user_data,
            role=self.role,
            security_group=primary_sg,
            require_imdsv2=True,
            http_put_response_hop_limit=2,
            instance_metadata_tags=False,
            key_pair=key_pair,
            placement_group=placement_group,
            block_devices=[
                ec2.BlockDevice(
                    device_name=root_device_name,
                    volume=ec2.BlockDeviceVolume.ebs(
                        root_volume_gib,
                        encrypted=True,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        delete_on_termination=True,
                    ),
                )
            ],
        )
        for sg in extra_sgs:
            self.launch_template.add_security_group(sg)
        #: The network cards with an EFA interface (empty without EFA).
        self.efa_cards: tuple[int, ...] = efa_layout.group_cards(
            self.instance_types, override=efa_cards, public_ip=associate_public_ip) \
            if efa else ()
        if efa or associate_public_ip:
            self._use_explicit_network_interface(public_ip=associate_public_ip)
        if capacity is not None:
            launch.reserve(self.launch_template, capacity)

        self.spot_capacity = spot_capacity
        #: The group names its launch template inside a MixedInstancesPolicy.
        self.mixed_instances = bool(spot_capacity or len(self.instance_types) > 1)
        placement: dict = {"launch_template": self.launch_template}
        if self.mixed_instances:
            placement = {"mixed_instances_policy": autoscaling.MixedInstancesPolicy(
                launch_template=self.launch_template,
                launch_template_overrides=[
                    autoscaling.LaunchTemplateOverrides(instance_type=ec2.InstanceType(t))
                    for t in self.instance_types] if len(self.instance_types) > 1 else None,
                instances_distribution=autoscaling.InstancesDistribution(
                    on_demand_allocation_strategy=(
                        autoscaling.OnDemandAllocationStrategy.PRIORITIZED
                        if len(self.instance_types) > 1 else None),
                    on_demand_base_capacity=desired_capacity - spot_capacity,
                    on_demand_percentage_above_base_capacity=0 if spot_capacity else 100,
                    spot_allocation_strategy=(
                        autoscaling.SpotAllocationStrategy.PRICE_CAPACITY_OPTIMIZED
                        if spot_capacity else None),
                ),
            )}
            if spot_capacity:
                placement["capacity_rebalance"] = True
        self.auto_scaling_group = autoscaling.AutoScalingGroup(
            self,
            "Group",
            vpc=vpc,
            vpc_subnets=vpc_subnets,
            min_capacity=min_capacity,
            max_capacity=max_capacity,
            desired_capacity=desired_capacity,
            notifications=[
                autoscaling.NotificationConfiguration(
                    topic=notification_topic,
                    scaling_events=autoscaling.ScalingEvents.ALL,
                )
            ],
            group_metrics=[autoscaling.GroupMetrics.all()],
            **placement,
        )
        # No instance before its subnets' default route (the NAT gateway's, or the internet
        # gateway's for a public master) exists: the user data's first act is a download from
        # S3, and SSM needs the same way out (ISubnet.internetConnectivityEstablished).
        selection = {name: getattr(vpc_subnets, name) for name in (
            "availability_zones", "one_per_az", "subnet_filters", "subnet_group_name",
            "subnet_type", "subnets") if getattr(vpc_subnets, name) is not None}
        self.auto_scaling_group.node.add_dependency(
            vpc.select_subnets(**selection).internet_connectivity_established)
        if group_placement_group is not None:
            group_cfn: autoscaling.CfnAutoScalingGroup = (
                self.auto_scaling_group.node.default_child)  # type: ignore[assignment]
            group_cfn.placement_group = group_placement_group.placement_group_name
        Tags.of(self.auto_scaling_group).add(ROLE_TAG_KEY, NODE_TYPES[node_type])
        Tags.of(self.auto_scaling_group).add(CLUSTER_TAG_KEY, cluster_id)
        # The group's tags reach its instances only; the cluster's cost tag (the budget's
        # filter) reaches their volumes through the launch template's tag specifications,
        # or the EBS cost of every node is outside the budget.
        Tags.of(self.launch_template).add(CLUSTER_TAG_KEY, cluster_id)

    def add_drain_hook(
        self, topic: sns.ITopic, *, heartbeat: Duration = Duration.seconds(DRAIN_HEARTBEAT_SECONDS)
    ) -> autoscaling.LifecycleHook:
        """The termination lifecycle hook ``drain`` (docs/protocol.md, "Elastic membership"):
        Auto Scaling holds a terminating instance in ``Terminating:Wait`` and notifies
        ``topic`` (the capacity adjuster turns that into a ``drain-request``) until the master
        agent completes the action, or ``heartbeat`` runs out. Default result CONTINUE: a lost
        notification or a dead master delays a termination, it never blocks it.

        CDK creates the role Auto Scaling assumes to publish, with ``sns:Publish`` on the
        topic and, the topic being KMS-encrypted, the key permissions publishing needs."""
        return self.auto_scaling_group.add_lifecycle_hook(
            "DrainHook",
            lifecycle_hook_name=DRAIN_HOOK_NAME,
            lifecycle_transition=autoscaling.LifecycleTransition.INSTANCE_TERMINATING,
            heartbeat_timeout=heartbeat,
            default_result=autoscaling.DefaultResult.CONTINUE,
            notification_target=hooktargets.TopicHook(topic),
        )

    def _use_explicit_network_interface(self, *, public_ip: bool) -> None:
        """EFA and public IPs need explicit interfaces, which then carry the groups: one per
        EFA network card (``constructs_lib.efa``), or the one primary interface."""
        cfn: ec2.CfnLaunchTemplate = self.launch_template.node.default_child  # type: ignore[assignment]
        groups = [sg.security_group_id for sg in self.launch_template.connections.security_groups]
        if self.efa_cards:
            interfaces = efa_layout.network_interfaces(self.efa_cards, groups=groups,
                                                       public_ip=public_ip)
        else:
            interfaces = [{"DeviceIndex": 0, "DeleteOnTermination": True, "Groups": groups,
                           "AssociatePublicIpAddress": True}]
        cfn.add_property_override("LaunchTemplateData.NetworkInterfaces", interfaces)
        cfn.add_property_deletion_override("LaunchTemplateData.SecurityGroupIds")

    @property
    def connections(self) -> ec2.Connections:
        """The nodes' connections (the launch template's security groups)."""
        return self.auto_scaling_group.connections

    @property
    def group_name(self) -> str:
        """The Auto Scaling group's name."""
        return self.auto_scaling_group.auto_scaling_group_name


def grant_node_access(role: iam.IRole, *, node_scripts: s3_assets.Asset,
                      file_system: efs.IFileSystem) -> None:
    """What the node agent, job executor and health check of every node need, and no more:
    exactly the one node-scripts object, root access to the file system, and the two
    Describe calls of discovery. The master queue is not here: only the master's agent
    reads it (``MetadataQueues.grant_agent_access`` on the master's role alone)."""
    # Exactly the one object (asset.grant_read would allow GetObject* on the whole bucket).
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="ReadNodeScripts",
            actions=["s3:GetObject"],
            resources=[node_scripts.bucket.arn_for_objects(node_scripts.s3_object_key)],
        )
    )
    # Mount (as root, through a mount target) and write: the agents own the cluster files.
    file_system.grant_root_access(role)
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="DiscoverClusterMembers",
            actions=["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances"],
            resources=["*"],  # these Describe APIs support no resource-level permissions
        )
    )

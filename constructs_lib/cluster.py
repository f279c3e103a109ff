"""DeepLearningCluster: network, EFS, queue, capacity adjuster, master and worker groups."""

from __future__ import annotations

from collections.abc import Sequence

import jsii
from aws_cdk import CfnWaitCondition, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib import launch, validation
from constructs_lib.capacity_adjuster import (
    CLUSTER_TAG_KEY,
    DEFAULT_LAUNCH_RETRY_SECONDS,
    CapacityAdjuster,
    grant_elastic_control,
)
from constructs_lib.cluster_budget import ClusterBudget
from constructs_lib.cluster_grants import grant_node_roles
from constructs_lib.cluster_nodes import add_node_groups
from constructs_lib.cluster_props import check_cluster_props
from constructs_lib.cluster_release import ClusterRelease
from constructs_lib.cluster_services import add_cluster_services
from constructs_lib.cluster_settings import (
    DEFAULT_DATA_CHECKSUMS,
    DEFAULT_MAX_REPLACEMENTS_PER_HOUR,
    DEFAULT_SCHEDULER,
    DEFAULT_SPOT_WORKERS,
    DEFAULT_WORKER_COUNT,
)
from constructs_lib.cluster_storage import add_cluster_storage
from constructs_lib.cost_tags import tag_cost_bearing
from constructs_lib.idle_stop import (
    DEFAULT_IDLE_STOP_MASTER_MINUTES,
    DEFAULT_IDLE_STOP_MINUTES,
    grant_idle_stop,
    grant_master_release,
    grant_wake_master,
)
from constructs_lib.images import DEFAULT_IMAGE_TYPE, deep_learning_ami
from constructs_lib.job_role import USER_TAG as JOB_USER_TAG
from constructs_lib.job_role import JobRole
from constructs_lib.late import late_string
from constructs_lib.metadata_queues import MetadataQueues
from constructs_lib.network import (
    DEFAULT_NAT_GATEWAYS,
    DEFAULT_VPC_CIDR,
    ClusterNetwork,
    node_security_groups,
)
from constructs_lib.node_group import DEFAULT_ROOT_VOLUME_GIB, NodeGroup
from constructs_lib.observability import (
    DEFAULT_EFS_IO_ALARM_GIB_PER_HOUR,
    DEFAULT_LOG_RETENTION_DAYS,
)
from constructs_lib.resume_sources import CheckpointSource, grant_resume_read
from constructs_lib.shared_storage import DEFAULT_MOUNT_POINT
from constructs_lib.user_data import DEFAULT_NODE_BOOT_SECONDS, MIN_SETUP_WAIT_SECONDS, setup_wait

# DEFAULT_WORKER_COUNT, DEFAULT_SPOT_WORKERS: the stack settings' defaults
# (constructs_lib.cluster_settings, the one description of each setting).
#: Fewest workers the cluster comes up with when launches fail.
DEFAULT_MIN_WORKERS = 1
#: How long the stack waits for the cluster to form with the default settings (the original
#: template's 55 minutes); longer boot budgets and zone moves lengthen it (``setup_wait``).
SETUP_TIMEOUT_SECONDS = MIN_SETUP_WAIT_SECONDS


@jsii.implements(ec2.IConnectable)
class DeepLearningCluster(Construct):
    """A distributed-training cluster: one master and ``worker_count`` workers.

    The master also trains (rank 0), as in the original template. Nodes live in the private
    subnets of every zone, or of one zone with a placement group, EFA or a reservation
    (``constructs_lib.launch.zone_plan``); the master moves to a public subnet only when
    ``ssh_cidr`` is given.

    Elastic training (docs/elastic.md): ``max_workers`` is the worker group's maximum, the
    ceiling of ``dl-scale --workers``; the worker group has a termination lifecycle hook
    (``drain``) so leaving workers are drained, and the master agent protects itself and the
    ``worker_count`` base workers from scale-in.
    """

    @validation.reports_path
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc | None = None,
        vpc_cidr: str = DEFAULT_VPC_CIDR,
        worker_count: int = DEFAULT_WORKER_COUNT,
        min_workers: int = DEFAULT_MIN_WORKERS,
        max_workers: int | None = None,
        worker_instance_type: ec2.InstanceType | str | None = None,
        master_instance_type: ec2.InstanceType | str | None = None,
        worker_instance_types: Sequence[ec2.InstanceType | str] | None = None,
        master_instance_types: Sequence[ec2.InstanceType | str] | None = None,
        capacity_reservation_id: str | None = None,
        capacity_reservation_group_arn: str | None = None,
        capacity_block_id: str | None = None,
        capacity_block_lead_minutes: int = launch.DEFAULT_CAPACITY_BLOCK_LEAD_MINUTES,
        availability_zones: Sequence[str] | None = None,
        max_zone_moves: int = launch.DEFAULT_MAX_ZONE_MOVES,
        launch_retry_seconds: int = DEFAULT_LAUNCH_RETRY_SECONDS,
        machine_image: ec2.IMachineImage | None = None,
        image_type: str = DEFAULT_IMAGE_TYPE,
        pytorch_version: str | None = None,
        root_device_name: str | None = None,
        file_system: efs.IFileSystem | None = None,
        efs_security_group: ec2.ISecurityGroup | None = None,
        efs_mount_point: str = DEFAULT_MOUNT_POINT,
        efs_require_tls: bool = True,
        ssh_cidr: str | None = None,
        key_pair: ec2.IKeyPair | None = None,
        root_volume_gib: int = DEFAULT_ROOT_VOLUME_GIB,
        placement_group: ec2.IPlacementGroup | None = None,
        create_placement_group: bool | None = None,
        nat_gateways: int = DEFAULT_NAT_GATEWAYS,
        efa: bool = False,
        efa_cards: Sequence[int] | None = None,
        cluster_id: str | None = None,
        setup_timeout_seconds: int | None = None,
        node_boot_seconds: int = DEFAULT_NODE_BOOT_SECONDS,
        spot_workers: int = DEFAULT_SPOT_WORKERS,
        warm_pool_size: int = 0,
        data_prep_script: str | None = None,
        max_replacements_per_hour: int = DEFAULT_MAX_REPLACEMENTS_PER_HOUR,
        idle_stop_minutes: int = DEFAULT_IDLE_STOP_MINUTES,
        idle_stop_master_minutes: int = DEFAULT_IDLE_STOP_MASTER_MINUTES,
        data_bucket: s3.IBucket | None = None,
        data_prefix: str = "",
        checkpoint_bucket: s3.IBucket | None = None,
        resume_from: Sequence[CheckpointSource] = (),
        budget_per_day: float | None = None,
        log_retention_days: int = DEFAULT_LOG_RETENTION_DAYS,
        alarm_email: str | None = None,
        efs_io_alarm_gib_per_hour: int = DEFAULT_EFS_IO_ALARM_GIB_PER_HOUR,
        cluster_users: Sequence[str] = (),
        shared_storage: str = "efs",
        data_checksums: str = DEFAULT_DATA_CHECKSUMS,
        scheduler: str = DEFAULT_SCHEDULER,
        allowed_images: Sequence[str] = (),
    ) -> None:
        """
        :param vpc: the VPC to run in; it needs private subnets with egress (and a public
            one for ``ssh_cidr``).
            :default: a new ``ClusterNetwork`` (2 AZs, public + private subnets, 1 NAT,
                flow logs)
        :param vpc_cidr: CIDR block of the new VPC (not used with ``vpc``).
            :default: ``10.0.0.0/16``
        :param worker_count: on-demand workers; the master trains too.
            :default: 2
        :param min_workers: fewest workers the cluster comes up with when launches fail.
            :default: 1
        :param max_workers: the worker group's maximum, how far ``dl-scale --workers`` grows.
            :default: ``worker_count + spot_workers``
        :param worker_instance_type: the workers' type (``ec2.InstanceType`` or a name).
            :default: ``g5.xlarge``
        :param master_instance_type: the master's type. :default: ``g5.xlarge``
        :param worker_instance_types: instead of ``worker_instance_type``, an ordered list: the
            first type with capacity launches (prioritized mixed instances policy).
            :default: none (the single type)
        :param master_instance_types: the same for the master. :default: none
        :param capacity_reservation_id: launch every node into this Capacity Reservation; the
            nodes then use one zone, the first of ``availability_zones`` (the reservation's).
            :default: none
        :param capacity_reservation_group_arn: the same with a reservation group.
            :default: none
        :param capacity_block_id: the same with a Capacity Block for ML. :default: none
        :param capacity_block_lead_minutes: with ``capacity_block_id``: the workers leave
            (drained) this many minutes before the block's end, the master 10 minutes
            later, ahead of EC2's terminations 30 minutes before it
            (``constructs_lib/capacity_block_end.py``). :default: 60
        :param availability_zones: the zones of a new VPC and the nodes' zone order (first
            preferred). :default: the region's first two
        :param max_zone_moves: zone moves the capacity adjuster may make when a single-zone
            cluster's launches fail for capacity, before it lowers the worker count.
            :default: 2
        :param launch_retry_seconds: how long, from a group's creation, a launch that failed
            for capacity or throttling is left to Auto Scaling's retries before the capacity
            adjuster acts on it (configuration errors act at once). :default: 600
        :param machine_image: the nodes' AMI; ``FixedAmi("ami-...")`` for an AMI id.
            :default: the latest PyTorch Deep Learning AMI of ``image_type``, resolved at
                deploy time from its public SSM parameter
        :param image_type: OS family of the AMI (``amazon-linux-2023`` or ``ubuntu``): the
            default image, its root device, its Python and how amazon-efs-utils is installed.
            :default: ``amazon-linux-2023`` (installs amazon-efs-utils, so TLS to EFS works)
        :param pytorch_version: the PyTorch line of the default image (``major.minor``), part
            of its SSM parameter name (not used with ``machine_image``).
            :default: the newest line AWS documents for ``image_type`` (2.13 on AL2023)
        :param root_device_name: the AMI's root device, which gets the root volume.
            :default: ``image_type``'s (``/dev/sda1`` on Ubuntu, ``/dev/xvda`` on AL2023)
        :param file_system: an existing EFS file system (e.g. from
            ``SharedFileSystem.from_file_system_id``); the cluster opens NFS to its nodes on
            its connections and grants them root access.
            :default: a new ``SharedFileSystem``
        :param efs_security_group: security group of the new file system's mount targets
            (not used with ``file_system``).
            :default: a new group that admits NFS from the cluster's nodes only
        :param efs_mount_point: where every node mounts the file system.
            :default: ``/efs``
        :param efs_require_tls: the new file system refuses clients without TLS (not used
            with ``file_system``).
            :default: True
        :param ssh_cidr: open SSH (22) from this CIDR to the master, which then starts in a
            public subnet; ``0.0.0.0/0`` is refused.
            :default: no SSH ingress at all (use SSM Session Manager)
        :param key_pair: EC2 key pair of the nodes.
            :default: none
        :param root_volume_gib: size of every node's encrypted gp3 root volume, at least 50.
            :default: 100
        :param placement_group: start every node in this placement group.
            :default: none (see ``create_placement_group``)
        :param create_placement_group: start every node in one zone, in a new cluster
            placement group (one per zone the capacity adjuster may move the cluster to;
            ``placement_group`` attribute): the lowest latency between nodes, and no training
            traffic billed between zones. False: the groups span every zone.
            :default: true, unless ``placement_group`` is given or the nodes launch into a
                reservation or a Capacity Block (one zone already; a new group would hold none
                of its capacity)
        :param nat_gateways: NAT gateways of a new VPC, one per zone from the first of
            ``availability_zones`` (``ClusterNetwork``); not used with ``vpc``.
            :default: 1
        :param efa: give the nodes an EFA interface on every EFA network card of their
            instance type (p5.48xlarge: 32, p4d.24xlarge: 4; ``constructs_lib.efa``); the type
            must support EFA. The nodes then start in one zone.
            :default: False
        :param efa_cards: with ``efa``, the network card indexes that get an EFA interface,
            for a type the table does not know.
            :default: the instance type's EFA cards (``constructs_lib.efa.EFA_CARDS``)
        :param cluster_id: the ``dl-cluster:id`` tag that scopes the cluster's permissions.
            :default: the stack name
        :param setup_timeout_seconds: how long the stack waits for the cluster to form (at
            most 43200, CloudFormation's 12 hours).
            :default: ``launch_retry_seconds + 300 x max_zone_moves + 2 x node_boot_seconds
                + 300``, at least 3300 (55 minutes, what the defaults give):
                ``user_data.setup_wait``
        :param node_boot_seconds: the node boot budget: how long the master waits, once the
            groups launched, for their nodes to boot and register before it forms the cluster
            without the missing ones (whose ids and types the agent logs); at least 60 and at
            most ``setup_timeout_seconds - 300``.
            :default: 900 (15 minutes: a DLAMI boots in minutes)
        :param spot_workers: Spot workers above the ``worker_count`` on-demand base.
            :default: 0
        :param warm_pool_size: stopped, pre-initialized workers kept in an Auto Scaling warm
            pool, so a replacement starts instead of booting (``constructs_lib/warm_pool.py``);
            not with ``spot_workers`` or several worker instance types.
            :default: 0 (no warm pool)
        :param data_prep_script: a command every node runs before it joins (one line).
            :default: none
        :param max_replacements_per_hour: the job controller's circuit breaker: at most this
            many instances marked Unhealthy (and replaced by Auto Scaling) in any hour; past
            it a node fault is recorded in the job's record and nobody is replaced.
            :default: 3
        :param idle_stop_minutes: the master's job controller scales the workers to zero
            after this many minutes with nothing to run, and back for the next job; 0: never
            (``constructs_lib/idle_stop.py``).
            :default: 60
        :param idle_stop_master_minutes: then, this many minutes later with still nothing
            to run and no session on the master, the master's own group goes to zero (the
            capacity adjuster releases it); ``dlc submit`` / ``dlc up`` wake it; 0: never
            (``bootstrap_scripts/jobs/controller/idle_master.py``).
            :default: 60
        :param data_bucket: an existing bucket with the training data; the nodes may list and
            read ``data_prefix`` of it (``dl-run --data`` stages it to local disk).
            :default: none (no data-bucket permission)
        :param data_prefix: the part of ``data_bucket`` the nodes may read.
            :default: ``""`` (the whole bucket)
        :param checkpoint_bucket: an existing bucket for checkpoints; the nodes may read and
            write ``checkpoints/<cluster_id>/`` of it.
            :default: a new versioned, KMS-encrypted, TLS-only, private bucket, RETAINed on
                stack deletion (``TrainingData``)
        :param resume_from: old clusters' checkpoints (their RETAINed buckets) the jobs may
            read, each user only their own part, for ``--resume-from`` (``resume_sources.py``).
            :default: () (no other cluster's checkpoints)
        :param budget_per_day: a daily AWS Budgets cost budget (USD) of the cluster's tagged
            costs, notifying an encrypted alarm topic (``ClusterBudget``).
            :default: none (no budget)
        :param log_retention_days: how long the cluster's log group keeps the nodes' logs
            (``ClusterObservability``). :default: 30
        :param alarm_email: an address subscribed to the alarm topic. :default: none
        :param efs_io_alarm_gib_per_hour: GiB of EFS metered I/O in an hour that raise the
            EFS I/O alarm (``ClusterObservability``); 0: none. :default: 50
        :param cluster_users: the Linux users jobs run as: one per-user Command document
            each, the only documents the operator policy runs (``OperatorAccess``).
            :default: ``()``, none (only the admin policy's any-user document runs)
        :param shared_storage: ``efs``, or ``fsx-lustre``: an FSx for Lustre file system
            too, mounted at ``/fsx`` on every node, ``/fsx/data`` linked to ``data_bucket``
            (``LustreStorage``). :default: ``efs``
        :param data_checksums: every node's default of ``dl-run --data-checksums``
            (``warn`` or ``required``; installed on the node, ``data.checksums``): what a
            job's ``--data`` staging does with an object botocore cannot check against S3's
            checksum when the job does not say. :default: ``warn``
        :param scheduler: ``native`` or ``slurm``: Slurm's daemons, with a munge key only the
            node roles read (``munge_key``, ``constructs_lib/slurm.py``). :default: ``native``
        :param allowed_images: repositories jobs may run images from; the node roles pull
            from the ECR ones (``constructs_lib/allowed_images.py``). :default: ``()``
        """
        super().__init__(scope, construct_id)
        setup_timeout_seconds = setup_wait(node_boot_seconds, launch_retry_seconds,
                                           max_zone_moves, given=setup_timeout_seconds)
        p = check_cluster_props(
            worker_count=worker_count, min_workers=min_workers, spot_workers=spot_workers,
            max_workers=max_workers, node_boot_seconds=node_boot_seconds,
            setup_timeout_seconds=setup_timeout_seconds, data_prep_script=data_prep_script,
            max_replacements_per_hour=max_replacements_per_hour,
            idle_stop_minutes=idle_stop_minutes,
            idle_stop_master_minutes=idle_stop_master_minutes,
            worker_instance_type=worker_instance_type,
            worker_instance_types=worker_instance_types,
            master_instance_type=master_instance_type,
            master_instance_types=master_instance_types,
            capacity_reservation_id=capacity_reservation_id,
            capacity_reservation_group_arn=capacity_reservation_group_arn,
            capacity_block_id=capacity_block_id, max_zone_moves=max_zone_moves,
            root_volume_gib=root_volume_gib, image_type=image_type,
            pytorch_version=pytorch_version, machine_image=machine_image,
            file_system=file_system, efs_security_group=efs_security_group,
            efs_require_tls=efs_require_tls, efs_mount_point=efs_mount_point,
            ssh_cidr=ssh_cidr, placement_group=placement_group, scheduler=scheduler,
            create_placement_group=create_placement_group, data_checksums=data_checksums,
            allowed_images=allowed_images,
            capacity_block_lead_minutes=capacity_block_lead_minutes)
        self.capacity, self.efs_mount_point = p.capacity, p.efs_mount_point
        self.cluster_id = cluster_id or Stack.of(self).stack_name
        self.worker_count, self.spot_workers = p.worker_count, p.spot_workers
        self.max_workers, self.data_prep_script = p.max_workers, p.data_prep_script
        self.allowed_images = p.allowed_images  #: repositories jobs may run images from

        # -- network, storage, queue ---------------------------------------------------------
        self.network = ClusterNetwork(self, "Network", vpc=vpc, cidr=vpc_cidr,
                                      availability_zones=None if vpc else availability_zones,
                                      nat_gateways=nat_gateways)
        new_pg = p.new_placement_group
        self.vpc = self.network.vpc
        self.zones = launch.zone_plan(
            self.vpc, zones=availability_zones, public_master=bool(ssh_cidr),
            single_zone=bool(efa or placement_group or new_pg
                             or self.capacity.reserved),
            fallback=bool(efa or new_pg) and not self.capacity.reserved,
            reservation_prop=self.capacity.reservation_prop)
        self.placement_groups = [ec2.PlacementGroup(
            self, "PlacementGroup" + (str(i + 1) if i else ""),
            strategy=ec2.PlacementGroupStrategy.CLUSTER,
        ) for i in range(len(self.zones.choices) if new_pg else 0)]

        # EFS, S3 for data and checkpoints, FSx for Lustre (cluster_storage.py)
        stored = add_cluster_storage(
            self, vpc=self.vpc, cluster_id=self.cluster_id, file_system=file_system,
            efs_security_group=efs_security_group, efs_mount_point=self.efs_mount_point,
            efs_require_tls=efs_require_tls, data_bucket=data_bucket, data_prefix=data_prefix,
            checkpoint_bucket=checkpoint_bucket, shared_storage=shared_storage,
            node_subnets=self.zones.node_subnets)
        self.storage, self.training_data = stored.storage, stored.training_data
        self.file_system: efs.IFileSystem = stored.file_system
        #: FSx for Lustre next to EFS (``sharedStorage=fsx-lustre``), in the nodes' first subnet
        self.lustre = stored.lustre

        self.queues = MetadataQueues(self, "MetadataQueues")
        self.master_queue = self.queues.master_queue

        pgs = [g.placement_group_name for g in self.placement_groups] or [""] * len(
            self.zones.choices)
        self.capacity_adjuster = CapacityAdjuster(
            self, "CapacityAdjuster", cluster_id=self.cluster_id, master_queue=self.master_queue,
            max_zone_moves=self.capacity.max_zone_moves,
            launch_retry_seconds=launch_retry_seconds, zone_choices=[
                (zone, subnet.subnet_id, pg)
                for (zone, subnet), pg in zip(self.zones.choices, pgs, strict=True)])
        self.topic = self.capacity_adjuster.topic
        self.capacity_function = self.capacity_adjuster.function

        # -- security groups: nodes talk freely to each other, nothing else gets in -----------
        self.node_security_group, self.admin_security_group = node_security_groups(
            self, self.vpc, ssh_cidr)
        self._connections = ec2.Connections(security_groups=[self.node_security_group])
        stored.admit(self)  # NFS to EFS from the nodes (2049), and Lustre's ports

        # A new cluster placement group per zone choice, set on the groups (where a zone move
        # can change it); a given one goes into the launch templates.
        self.placement_group = self.placement_groups[0] if self.placement_groups else \
            placement_group
        # -- nodes: what they boot from and with, the master and worker groups, the workers'
        # drain hook, the warm pool (``cluster_nodes.py``) --------------------------------------
        nodes = add_node_groups(
            self, props=p, cluster_id=self.cluster_id, vpc=self.vpc, zones=self.zones,
            machine_image=machine_image or deep_learning_ami(
                image_type, pytorch_version=p.pytorch_version),
            root_device_name=root_device_name or p.family.root_device_name,
            node_security_group=self.node_security_group,
            admin_security_group=self.admin_security_group,
            capacity_adjuster=self.capacity_adjuster, master_queue=self.master_queue,
            storage=stored, setup_timeout_seconds=setup_timeout_seconds,
            # The job role trusts the node roles, made with the groups.
            job_role_arn=late_string(lambda: self.job_role.role_arn),
            key_pair=key_pair, placement_group=placement_group,
            new_placement_group=self.placement_groups[0] if self.placement_groups else None,
            efa=efa, efa_cards=efa_cards, warm_pool_size=warm_pool_size,
            public_master=bool(ssh_cidr))
        self.node_scripts, self.wait_handle = nodes.node_scripts, nodes.wait_handle
        self.membership_key = nodes.membership_key
        self.munge_key = nodes.munge_key  #: Slurm's munge key (None with ``native``)
        self.master_group: NodeGroup = nodes.master_group
        self.worker_group: NodeGroup = nodes.worker_group
        self.drain_hook = nodes.drain_hook
        #: Where warm-pool workers say they are ready (None without a warm pool).
        self.warm_ready_queue = nodes.warm_ready_queue
        self.node_keys = nodes.node_keys  #: where workers give the master their keys
        #: The warm pool's launch hook (None without a warm pool): ``warm_pool.py``.
        self.warm_launch_hook = nodes.warm_launch_hook
        #: The role jobs get credentials of (never the node's): ``constructs_lib/job_role.py``.
        self.job_role = JobRole(self, "JobRole", cluster_id=self.cluster_id,
                                node_roles=[self.master_group.role, self.worker_group.role])
        # Data and checkpoints are the jobs' (each user's own checkpoint prefix), not the nodes'.
        self.training_data.grant_data_read(self.job_role.role)
        self.training_data.grant_checkpoint_read_write(self.job_role.role,
                                                       per_user_tag=JOB_USER_TAG)
        #: Old clusters' checkpoints the jobs may read (``resume_sources.py``).
        self.resume_from = tuple(resume_from)
        grant_resume_read(self.job_role.role, self.resume_from, user_tag=JOB_USER_TAG)
        grant_elastic_control(self, self.master_group.role, self.cluster_id)
        if p.idle_stop:
            grant_idle_stop(self, self.master_group.role, cluster_id=self.cluster_id,
                            min_workers=p.min_workers)
        if p.idle_stop_master:  # the master asks the function to release its own group
            grant_master_release(self.master_group.role, self.capacity_adjuster.function)
        grant_node_roles(master=self.master_group, workers=self.worker_group,
                         queues=self.queues, membership_key=self.membership_key,
                         node_scripts=self.node_scripts, file_system=self.file_system,
                         capacity_adjuster=self.capacity_adjuster)

        self.wait_condition = CfnWaitCondition(self, "SetupComplete", handle=self.wait_handle.ref,
                                               count=1, timeout=str(setup_timeout_seconds))
        self.wait_condition.node.add_dependency(self.master_group.auto_scaling_group)
        #: Lifts scale-in protection before the groups' deletion (``cluster_release.py``);
        #: created before the wait condition, so a rollback deletes it too.
        self.release = ClusterRelease(self, "Release", cluster_id=self.cluster_id,
                                      adjuster=self.capacity_adjuster,
                                      groups=[self.master_group, self.worker_group])
        self.wait_condition.node.add_dependency(self.release)
        # Operator access, workdir staging, logs and alarms, the budget (cluster_services.py).
        services = add_cluster_services(
            self, cluster_id=self.cluster_id, master_group=self.master_group,
            worker_group=self.worker_group, cluster_users=cluster_users,
            log_retention_days=log_retention_days, alarm_email=alarm_email,
            budget_per_day=budget_per_day, efs_file_system_id=self.file_system.file_system_id,
            efs_io_alarm_gib_per_hour=efs_io_alarm_gib_per_hour)
        self.operator_access = services.operator_access
        if p.idle_stop_master:  # dlc submit / dlc up wake the master the idle stop stopped
            grant_wake_master(self, self.operator_access.policy, cluster_id=self.cluster_id)
        self.workdir_staging = services.workdir_staging
        self.observability = services.observability
        #: the cluster's daily cost budget (``constructs_lib/cluster_budget``), notifying the
        #: one alarm topic of the cluster
        self.budget: ClusterBudget | None = services.budget
        tag_cost_bearing(self, CLUSTER_TAG_KEY, self.cluster_id)  # Budgets' and Cost Explorer's

    @property
    def connections(self) -> ec2.Connections:
        """The nodes' connections: ``cluster.connections.allow_from(peer, port)`` opens a port
        on every node (for example a notebook host reaching TensorBoard)."""
        return self._connections

"""A cluster's nodes: what every node boots with, the master and worker groups, the
workers' drain hook and the warm pool.

:class:`~constructs_lib.cluster.DeepLearningCluster` makes its network, storage, queues and
capacity adjuster first; the node groups need all of them, and the job role, the grants and
the services need the groups. This module is that middle step, in one call
(:func:`add_node_groups`), so the cluster's module reads as the order of its steps. The
constructs are children of the cluster itself (their construct ids, and so the template's
logical ids, are the cluster's own):

- what the nodes boot from: ``NodeScripts`` (the node scripts' asset), ``SetupHandle``
  (the stack's setup wait, signalled by the master, or by the capacity adjuster when the
  master never launched), ``MembershipKey`` (the master signs every membership it
  publishes, the workers check it);
- the boot settings (``user_data.node_user_data``): the same on both groups (among them
  the nodes' default ``dl-run --data-checksums``, since dl-run runs on any node), plus the
  master's own (the base workers, the circuit breaker, idle stop, the warm pool's worker
  role);
- ``MasterGroup``: one instance in the master's subnets (a public one with ``ssh_cidr``,
  then with the admin security group too), the setup wait handle in its user data;
- ``WorkerGroup``: ``min_workers`` to ``max_workers``, Spot above the on-demand base, with
  the ``drain`` termination hook so leaving workers are drained first (docs/protocol.md,
  "Elastic membership");
- ``MungeKey`` (``scheduler=slurm`` only): the cluster's munge key in Secrets Manager, its
  ARN in both groups' user data, read by both node roles (``slurm.py``);
- ``NodeKeys``: the queue workers send their record-signing public keys on, the master
  alone receives (``node_keys.py``); the master's user data names the workers' role whose
  sessions it believes;
- with a Capacity Block: ``CapacityBlockEnd``, the block's end read at deploy time and the
  groups released before EC2 terminates the block's instances (``capacity_block_end.py``);
  without one, ``QuotaCheck`` (``quota_check.py``);
- with a warm pool: ``WarmReady``, the queue warm-pool workers say they are ready on, and
  the pool with its launch hook (``warm_pool.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import CfnWaitConditionHandle, Duration, RemovalPolicy
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from bootstrap_scripts.agent.settings import SLURM_SCHEDULER
from bootstrap_scripts.metrics import metric_names as names
from constructs_lib import launch, warm_pool
from constructs_lib.allowed_images import grant_image_pulls
from constructs_lib.capacity_adjuster import CapacityAdjuster
from constructs_lib.capacity_block_end import CapacityBlockEnd
from constructs_lib.cluster_props import ClusterProps
from constructs_lib.cluster_storage import ClusterStorage
from constructs_lib.efs_access_check import EfsAccessCheck
from constructs_lib.late import late_string
from constructs_lib.node_group import NodeGroup
from constructs_lib.node_keys import NodeKeysQueue
from constructs_lib.package_paths import ASSET_EXCLUDES, node_scripts_dir
from constructs_lib.quota_check import QuotaCheck
from constructs_lib.slurm import MungeKey
from constructs_lib.user_data import node_user_data


@dataclass(frozen=True)
class ClusterNodes:
    """The constructs :func:`add_node_groups` made (the cluster's attributes of the same
    names)."""

    #: the node scripts every node installs from
    node_scripts: s3_assets.Asset
    #: the stack's setup wait (``SetupHandle``)
    wait_handle: CfnWaitConditionHandle
    #: the key the master signs the membership with
    membership_key: kms.Key
    master_group: NodeGroup
    worker_group: NodeGroup
    #: the worker group's termination hook ``drain``
    drain_hook: autoscaling.LifecycleHook
    #: where warm-pool workers say they are ready (None without a warm pool)
    warm_ready_queue: sqs.Queue | None
    #: the warm pool's launch hook (None without a warm pool)
    warm_launch_hook: autoscaling.LifecycleHook | None
    #: where workers give the master their record-signing keys (``node_keys.py``)
    node_keys: NodeKeysQueue
    #: Slurm's munge key (None unless ``scheduler=slurm``)
    munge_key: MungeKey | None


def add_node_groups(
    cluster: Construct, *, props: ClusterProps, cluster_id: str, vpc: ec2.IVpc,
    zones: launch.ZonePlan, machine_image: ec2.IMachineImage, root_device_name: str,
    node_security_group: ec2.ISecurityGroup, admin_security_group: ec2.ISecurityGroup | None,
    capacity_adjuster: CapacityAdjuster, master_queue: sqs.IQueue, storage: ClusterStorage,
    setup_timeout_seconds: int, job_role_arn: str,
    key_pair: ec2.IKeyPair | None, placement_group: ec2.IPlacementGroup | None,
    new_placement_group: ec2.IPlacementGroup | None, efa: bool,
    efa_cards: Sequence[int] | None, warm_pool_size: int, public_master: bool,
) -> ClusterNodes:
    """The node groups, as children of ``cluster`` (see the module's docstring).

    ``placement_group``: a given group, set in the launch templates; ``new_placement_group``:
    the first of the cluster's new ones, set on the groups (where a zone move can change
    it). ``job_role_arn``: the job role trusts the node roles, so it is made after the
    groups (a late string). ``public_master``: ``ssh_cidr`` was given. A bad
    ``warm_pool_size`` raises ``ConfigError`` naming the cluster's path."""
    node_scripts = s3_assets.Asset(
        cluster, "NodeScripts", path=str(node_scripts_dir()), exclude=ASSET_EXCLUDES
    )
    wait_handle = CfnWaitConditionHandle(cluster, "SetupHandle")
    # The master signs every membership it publishes; workers apply only what KMS says
    # this key signed (docs/security.md): root on a worker can write the file on EFS,
    # not make the other workers believe it. Asymmetric keys cannot rotate (KMS).
    membership_key = kms.Key(
        cluster, "MembershipKey", key_spec=kms.KeySpec.ECC_NIST_P256,
        key_usage=kms.KeyUsage.SIGN_VERIFY, removal_policy=RemovalPolicy.DESTROY,
        description="Signs the cluster's membership (the master signs, workers verify)")
    capacity_adjuster.signal_setup_failures(wait_handle)  # master never launched

    topic = capacity_adjuster.topic
    warm_pool_size = warm_pool.check(cluster.node.path, warm_pool_size,
                                     spot_capacity=props.spot_workers,
                                     instance_types=props.capacity.worker_types,
                                     capacity_block_id=props.capacity.capacity_block_id)
    warm_ready_queue = warm_pool.ready_queue(
        cluster, Duration.seconds(props.node_boot_seconds)) if warm_pool_size else None

    node_keys = NodeKeysQueue(cluster, "NodeKeys")
    munge_key = MungeKey(cluster, "MungeKey") if props.scheduler == SLURM_SCHEDULER else None
    family, lustre, capacity = props.family, storage.lustre, props.capacity
    # What every node boots with (``user_data.py``); the master's own settings below.
    boot = dict(
        node_keys_queue_url=node_keys.queue.queue_url,
        cluster_id=cluster_id, master_queue_url=master_queue.queue_url,
        efs_id=storage.file_system.file_system_id, mount_point=props.efs_mount_point,
        setup_timeout_seconds=setup_timeout_seconds,
        asset_s3_url=node_scripts.s3_object_url, python=family.python,
        efs_utils_install=family.efs_utils_install, data_prep=props.data_prep_script,
        membership_key=membership_key.key_arn, job_role_arn=job_role_arn,
        checkpoint_url=storage.training_data.checkpoint_url,
        node_boot_seconds=props.node_boot_seconds, data_checksums=props.data_checksums,
        allowed_images=",".join(props.allowed_images),
        scheduler=props.scheduler, munge_key_secret=munge_key.secret_arn if munge_key else "",
        slurm_install=family.slurm_install if munge_key else "",
        slurm_from_source=family.slurm_from_source and munge_key is not None,
        launch_hook=warm_pool.WARM_HOOK_NAME if warm_pool_size else "",
        warm_ready_queue_url=warm_ready_queue.queue_url if warm_ready_queue else "",
        log_group=names.log_group_name(cluster_id),
        cloudwatch_agent_install=family.cloudwatch_agent_install,
        mount_s3_install=family.mount_s3_install, nftables_install=family.nftables_install,
        lustre_mount=(family.lustre_client_install, lustre.mount_source,
                      lustre.mount_point) if lustre else None,
    )
    common = dict(  # both groups'
        cluster_id=cluster_id, vpc=vpc, machine_image=machine_image,
        notification_topic=topic, root_device_name=root_device_name,
        root_volume_gib=props.root_volume_gib, key_pair=key_pair,
        placement_group=placement_group, group_placement_group=new_placement_group,
        efa=efa, efa_cards=efa_cards, capacity=capacity,
    )
    master_groups = [node_security_group]
    if admin_security_group is not None:
        master_groups.append(admin_security_group)
    master = NodeGroup(
        cluster, "MasterGroup", node_type="master", vpc_subnets=zones.master_subnets,
        instance_type=capacity.master_types[0],
        fallback_instance_types=capacity.master_types[1:],
        user_data=node_user_data(
            node_type="master", wait_handle=wait_handle.ref,
            base_workers=props.worker_count,
            max_replacements_per_hour=props.max_replacements_per_hour,
            idle_stop_seconds=props.idle_stop,
            idle_stop_master_seconds=props.idle_stop_master,
            release_function=(capacity_adjuster.function.function_name
                              if props.idle_stop_master else ""),
            worker_role_id=late_string(lambda: workers.role.role_id), **boot),
        security_groups=master_groups, min_capacity=1, max_capacity=1, desired_capacity=1,
        associate_public_ip=public_master, **common,
    )
    workers = NodeGroup(
        cluster, "WorkerGroup", node_type="worker", vpc_subnets=zones.node_subnets,
        instance_type=capacity.worker_types[0],
        fallback_instance_types=capacity.worker_types[1:],
        user_data=node_user_data(node_type="worker", wait_handle="", **boot),
        security_groups=[node_security_group], min_capacity=props.min_workers,
        max_capacity=props.max_workers, desired_capacity=props.desired_workers,
        spot_capacity=props.spot_workers, **common,
    )
    for _zone, subnet in zones.choices[1:]:
        # A zone move puts both groups in this subnet: its egress (the NAT route) must outlive
        # them, as their first subnet's does, so that a moved cluster's drains still reach
        # AWS while CloudFormation deletes the groups.
        for group in (master, workers):
            group.auto_scaling_group.node.add_dependency(subnet.internet_connectivity_established)
    if storage.storage is None and not isinstance(storage.file_system, efs.FileSystem):
        # an existing EFS: NFS from every zone the nodes may use, before either group launches
        EfsAccessCheck(
            cluster, "EfsAccessCheck", file_system_id=storage.file_system.file_system_id,
            node_security_group=node_security_group, adjuster=capacity_adjuster,
            subnets=[*(zones.node_subnets.subnets or ()), *(zones.master_subnets.subnets or ()),
                     *(s for _z, s in zones.choices)],
            groups=[master, workers])
    if not capacity.capacity_block_id:  # the vCPU quotas, before either group launches
        QuotaCheck(cluster, "QuotaCheck", props=props, adjuster=capacity_adjuster,
                   groups=[master, workers])
    else:  # the block's end read before either group launches, the nodes leave before it
        CapacityBlockEnd(cluster, "CapacityBlockEnd", block_id=capacity.capacity_block_id,
                         lead_minutes=capacity.capacity_block_lead_minutes,
                         adjuster=capacity_adjuster, master=master, workers=workers)
    # Leaving workers are drained first (docs/protocol.md, "Elastic membership").
    drain_hook = workers.add_drain_hook(topic)
    drain_hook.node.add_dependency(capacity_adjuster)
    node_keys.grant(workers=workers.role, master=master.role)
    grant_image_pulls([master.role, workers.role], props.allowed_images)
    if munge_key is not None:  # the node roles alone read the munge key
        for group in (master, workers):
            munge_key.grant_read(group.role)
    warm_launch_hook = warm_pool.add_warm_pool(
        workers, warm_pool_size, cluster_id=cluster_id,
        heartbeat=Duration.seconds(props.node_boot_seconds), master=master,
        queue=warm_ready_queue) if warm_ready_queue else None
    return ClusterNodes(node_scripts=node_scripts, wait_handle=wait_handle,
                        membership_key=membership_key, master_group=master,
                        worker_group=workers, drain_hook=drain_hook,
                        warm_ready_queue=warm_ready_queue, warm_launch_hook=warm_launch_hook,
                        node_keys=node_keys, munge_key=munge_key)

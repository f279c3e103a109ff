"""The props of a :class:`~constructs_lib.cluster.DeepLearningCluster`, checked together.

Every prop the construct builds from is checked here, once, before anything is made, in one
order (the first bad one is the one named): the worker counts, the node boot budget, the
boot command, the circuit breaker, idle stop, the capacity props (``launch.py``), the root
volume, the image (``images.py``), the SSH range, the mount point, the storage and
placement combinations, the nodes' default ``--data-checksums`` and the scheduler. A bad one raises
:class:`validation.ConfigError` naming the prop and its value; the construct's
``reports_path`` puts its path in front. The construct keeps the checked values
(:class:`ClusterProps`), never the raw ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs

from bootstrap_scripts.agent.settings import SCHEDULERS
from constructs_lib import launch, validation
from constructs_lib.allowed_images import check_allowed_images
from constructs_lib.cluster_settings import DEFAULT_INSTANCE_TYPE
from constructs_lib.idle_stop import idle_stop_seconds
from constructs_lib.images import ImageFamily, check_image, image_family
from constructs_lib.user_data import boot_budget


@dataclass(frozen=True)
class ClusterProps:
    """The checked props the cluster is built from (the rest are used as given)."""

    worker_count: int
    min_workers: int
    spot_workers: int
    #: the worker group's maximum (``worker_count + spot_workers`` unless given)
    max_workers: int
    node_boot_seconds: int
    data_prep_script: str | None
    max_replacements_per_hour: int
    #: the controller's ``--idle-stop-seconds`` (0: never)
    idle_stop: int
    #: the controller's ``--idle-stop-master-seconds`` (0: the master never stops)
    idle_stop_master: int
    capacity: launch.Capacity
    root_volume_gib: int
    family: ImageFamily
    #: the default image's PyTorch line (None: the family's default)
    pytorch_version: str | None
    efs_mount_point: str
    #: the nodes' default ``dl-run --data-checksums`` (``dataChecksums``)
    data_checksums: str
    #: ``native`` or ``slurm`` (``scheduler``: ``constructs_lib/slurm.py``)
    scheduler: str
    #: repositories jobs may run images from (``allowedImages``: ``allowed_images.py``)
    allowed_images: tuple[str, ...] = ()
    #: the cluster makes its own cluster placement groups (one per zone it may move to)
    new_placement_group: bool = False

    @property
    def desired_workers(self) -> int:
        """The workers the cluster starts with: the on-demand base and the Spot ones."""
        return self.worker_count + self.spot_workers


def check_cluster_props(
    *,
    worker_count: int, min_workers: int, spot_workers: int, max_workers: int | None,
    node_boot_seconds: int, setup_timeout_seconds: int, data_prep_script: str | None,
    max_replacements_per_hour: int, idle_stop_minutes: int, idle_stop_master_minutes: int,
    worker_instance_type: ec2.InstanceType | str | None,
    worker_instance_types: Sequence[ec2.InstanceType | str] | None,
    master_instance_type: ec2.InstanceType | str | None,
    master_instance_types: Sequence[ec2.InstanceType | str] | None,
    capacity_reservation_id: str | None, capacity_reservation_group_arn: str | None,
    capacity_block_id: str | None, max_zone_moves: int, root_volume_gib: int,
    image_type: str, pytorch_version: str | None, machine_image: ec2.IMachineImage | None,
    file_system: efs.IFileSystem | None, efs_security_group: ec2.ISecurityGroup | None,
    efs_require_tls: bool, efs_mount_point: str, ssh_cidr: str | None,
    placement_group: ec2.IPlacementGroup | None, create_placement_group: bool | None,
    data_checksums: str, scheduler: str, allowed_images: Sequence[str] = (),
    capacity_block_lead_minutes: int = launch.DEFAULT_CAPACITY_BLOCK_LEAD_MINUTES,
) -> ClusterProps:
    """The cluster's props checked (each as the construct documents it); ConfigError
    naming the first bad one."""
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
    node_boot_seconds = boot_budget(node_boot_seconds, setup_timeout_seconds)
    if data_prep_script is not None:
        data_prep_script = validation.one_line("data_prep_script", data_prep_script)
    max_replacements_per_hour = validation.positive_int(
        "max_replacements_per_hour", max_replacements_per_hour, minimum=0)
    idle_stop = idle_stop_seconds("idle_stop_minutes", idle_stop_minutes)
    new_placement_group = wants_new_placement_group(
        create_placement_group, placement_group=placement_group,
        reserved=any((capacity_reservation_id, capacity_reservation_group_arn,
                      capacity_block_id)))
    idle_stop_master = idle_stop_seconds("idle_stop_master_minutes", idle_stop_master_minutes)
    capacity = launch.check_capacity(
        worker_types=launch.types_prop("worker_instance_type", worker_instance_type,
                                       "worker_instance_types", worker_instance_types,
                                       DEFAULT_INSTANCE_TYPE),
        master_types=launch.types_prop("master_instance_type", master_instance_type,
                                       "master_instance_types", master_instance_types,
                                       DEFAULT_INSTANCE_TYPE),
        reservation_id=capacity_reservation_id, max_zone_moves=max_zone_moves,
        reservation_group_arn=capacity_reservation_group_arn,
        capacity_block_id=capacity_block_id, spot_workers=spot_workers,
        new_placement_group=new_placement_group,
        capacity_block_lead_minutes=capacity_block_lead_minutes)
    if new_placement_group:
        launch.check_cluster_placement(capacity)
    root_volume_gib = validation.root_volume("root_volume_gib", root_volume_gib)
    family = image_family(image_type)
    pytorch_version = check_image(image_type, pytorch_version,
                                  public_image=machine_image is None,
                                  tls_only_file_system=file_system is None and efs_require_tls)
    if ssh_cidr:
        validation.ssh_cidr("ssh_cidr", ssh_cidr)
    efs_mount_point = validation.mount_point("efs_mount_point", efs_mount_point)
    if file_system is not None and efs_security_group is not None:
        raise validation.ConfigError(
            "efs_security_group is for the file system the cluster creates; a "
            "file_system brings its own security groups"
        )
    if isinstance(placement_group, bool):
        raise validation.ConfigError(
            "placement_group takes an ec2.IPlacementGroup; for a new cluster placement "
            f"group pass create_placement_group=True, got {placement_group!r}"
        )
    if create_placement_group and placement_group is not None:
        raise validation.ConfigError(
            "give either placement_group or create_placement_group=True, not both"
        )
    data_checksums = validation.checksum_mode("data_checksums", data_checksums)
    scheduler = validation.one_of("scheduler", scheduler, SCHEDULERS)
    return ClusterProps(
        worker_count=worker_count, min_workers=min_workers, spot_workers=spot_workers,
        max_workers=max_workers, node_boot_seconds=node_boot_seconds,
        data_prep_script=data_prep_script, max_replacements_per_hour=max_replacements_per_hour,
        idle_stop=idle_stop, idle_stop_master=idle_stop_master if idle_stop else 0,
        capacity=capacity, root_volume_gib=root_volume_gib,
        family=family, pytorch_version=pytorch_version, efs_mount_point=efs_mount_point,
        data_checksums=data_checksums, scheduler=scheduler,
        allowed_images=check_allowed_images("allowed_images", list(allowed_images)),
        new_placement_group=new_placement_group)


def wants_new_placement_group(create: bool | None, *, placement_group: object,
                              reserved: bool) -> bool:
    """Whether the cluster makes its own cluster placement groups. Given (True or False),
    as given. Unset (None), yes: one zone and one placement group keep the training traffic
    off the zones' links (billed per GB both ways, and slower), unless a ``placement_group``
    is given, or the nodes launch into a reservation or a Capacity Block: that is one zone
    already, and a new placement group holds none of the reserved capacity (a reservation
    serves a cluster placement group only when it was created in it; a block's instances
    are placed together by EC2 itself)."""
    if create is not None:
        return bool(create)
    return placement_group is None and not reserved

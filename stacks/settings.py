"""Turn CDK context values (strings from `-c key=value`, or JSON from cdk.json) into settings.

Each key, its default, its bounds and its check are described once, in
``constructs_lib.cluster_settings.ClusterSettings``; this module adds what spans several
keys. Every bad value fails synth with a message naming the context key, the value and the
limit; unset keys keep the defaults, which are the construct's own.
"""

from __future__ import annotations

from collections.abc import Callable

from constructs_lib import validation
from constructs_lib.cluster_settings import ClusterSettings
from constructs_lib.images import image_family, published_pytorch
from constructs_lib.setting import context_keys
from stacks.context import ContextReader

#: context key -> ClusterSettings field (derived from the field descriptions).
CONTEXT_KEYS: dict[str, str] = context_keys(ClusterSettings)
#: The keys of README "When capacity is short".
CAPACITY_CONTEXT_KEYS: dict[str, str] = {
    k: v for k, v in CONTEXT_KEYS.items()
    if k in ("workerInstanceTypes", "masterInstanceTypes", "capacityReservationId",
             "capacityReservationGroupArn", "capacityBlockId", "availabilityZones",
             "maxZoneMoves", "launchRetrySeconds")}


def settings_from_context(get: Callable[[str], object]) -> ClusterSettings:
    """Build the stack's settings from a context getter (``app.node.try_get_context``)."""
    ctx = ContextReader(get)
    ctx.one_of(("workerInstanceType", "workerInstanceTypes"),
               ("masterInstanceType", "masterInstanceTypes"),
               ("capacityReservationId", "capacityReservationGroupArn", "capacityBlockId"))
    settings = ctx.settings(ClusterSettings)
    if settings.ssh_cidr and not settings.ssh_allow_wide_cidr:
        ctx.checked("sshCidr", lambda n, v: validation.ssh_cidr(
            n, v, wide_opt_in="sshAllowWideCidr"))
    _check_existing_vpc(settings)
    if settings.data_prefix and not settings.data_bucket:
        raise validation.ConfigError(
            f"context key 'dataPrefix' is a prefix of 'dataBucket', which is not set; got "
            f"dataPrefix={settings.data_prefix!r}")
    _check_image(settings)
    _check_warm_pool(settings)
    needed = settings.worker_count + settings.spot_workers
    if settings.max_workers is not None and settings.max_workers < needed:
        raise validation.ConfigError(
            f"context key 'maxWorkers' must be at least workerCount + spotWorkers ({needed}), "
            f"got {settings.max_workers}"
        )
    return settings


def _check_warm_pool(s: ClusterSettings) -> None:
    """AWS refuses a warm pool on a group that launches Spot or has a mixed instances
    policy (constructs_lib/warm_pool.py): say so with the context keys."""
    if not s.warm_pool_size:
        return
    if s.spot_workers:
        raise validation.ConfigError(
            f"context key 'warmPoolSize' ({s.warm_pool_size}) cannot be used with "
            f"'spotWorkers' ({s.spot_workers}): Auto Scaling has no warm pool for a group "
            "that launches Spot Instances")
    if s.worker_instance_types and len(s.worker_instance_types) > 1:
        raise validation.ConfigError(
            f"context key 'warmPoolSize' ({s.warm_pool_size}) cannot be used with "
            f"'workerInstanceTypes' ({','.join(s.worker_instance_types)}): Auto Scaling has "
            "no warm pool for a group with a mixed instances policy; give one "
            "'workerInstanceType'")


def _check_existing_vpc(s: ClusterSettings) -> None:
    """An existing VPC is imported from its ids (``ec2.Vpc.from_vpc_attributes``: no lookup,
    so synth needs no AWS access): the subnets and their zones must be given and agree. An
    existing file system lives in an existing VPC, so it needs one."""
    def error(message: str) -> validation.ConfigError:
        return validation.ConfigError(f"context key {message}")

    if s.vpc_id is None:
        if s.efs_file_system_id:
            raise error(f"'efsFileSystemId' needs 'vpcId' (with 'vpcPrivateSubnetIds' and "
                        f"'availabilityZones'): an existing file system is in an existing VPC, "
                        f"and its mount targets cannot reach a new one; got "
                        f"efsFileSystemId={s.efs_file_system_id!r} without vpcId")
        for key, value in (("vpcPrivateSubnetIds", s.vpc_private_subnet_ids),
                           ("vpcPublicSubnetIds", s.vpc_public_subnet_ids)):
            if value:
                raise error(f"'{key}' is for an existing VPC and needs 'vpcId', got "
                            f"{','.join(value)!r}")
        return
    if s.vpc_cidr != ClusterSettings.vpc_cidr:
        raise error(f"'vpcCidr' is the CIDR of a new VPC and does not go with 'vpcId', got "
                    f"vpcCidr={s.vpc_cidr!r} with vpcId={s.vpc_id!r}")
    zones = s.availability_zones or ()
    if not s.vpc_private_subnet_ids or not zones:
        raise error(f"'vpcId' needs 'vpcPrivateSubnetIds' and 'availabilityZones' (the "
                    f"subnets' zones, in the same order), got vpcId={s.vpc_id!r} with "
                    f"vpcPrivateSubnetIds={s.vpc_private_subnet_ids!r}, "
                    f"availabilityZones={s.availability_zones!r}")
    for key, ids in (("vpcPrivateSubnetIds", s.vpc_private_subnet_ids),
                     ("vpcPublicSubnetIds", s.vpc_public_subnet_ids)):
        if ids and len(ids) != len(zones):
            raise error(f"'{key}' must list one subnet per zone of 'availabilityZones' "
                        f"({len(zones)}: {','.join(zones)}), got {len(ids)}: {','.join(ids)}")
    if s.ssh_cidr and not s.vpc_public_subnet_ids:
        raise error(f"'sshCidr' with 'vpcId' needs 'vpcPublicSubnetIds' (the master moves to a "
                    f"public subnet), got sshCidr={s.ssh_cidr!r}")


def _check_image(s: ClusterSettings) -> None:
    """The public DLAMI must exist for ``imageType`` and ``pytorchVersion`` (each line is its
    own SSM parameter), and its OS must be able to mount the new, TLS-only file system
    (docs/node-agent.md, "The machine image", "Mounting EFS"). A custom AMI (``amiId``) is
    neither looked up nor known: it is the user's to have amazon-efs-utils."""
    if s.ami_id:
        return
    if s.pytorch_version is not None:
        try:
            published_pytorch(s.image_type, s.pytorch_version, name="'pytorchVersion'",
                              os_name="'imageType'")
        except validation.ConfigError as exc:
            raise validation.ConfigError(f"context key {exc}") from None
    if not image_family(s.image_type).mounts_tls and not s.efs_file_system_id:
        raise validation.ConfigError(
            f"context key 'imageType'={s.image_type!r} cannot mount the stack's file system: "
            f"it refuses clients without TLS, TLS to EFS needs amazon-efs-utils, and the "
            f"{s.image_type} Deep Learning AMI has none and its OS no package for it (AWS "
            f"documents building it from source). Use imageType=amazon-linux-2023 (the "
            f"default), or amiId with an image that has amazon-efs-utils")

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
from constructs_lib.network import DEFAULT_MAX_AZS
from constructs_lib.setting import context_keys
from stacks.context import ContextReader
from stacks.vpc_rules import ExistingVpc, ExistingVpcKeys, check_existing_vpc

#: context key -> ClusterSettings field (derived from the field descriptions).
CONTEXT_KEYS: dict[str, str] = context_keys(ClusterSettings)
#: The keys of docs/capacity.md.
CAPACITY_CONTEXT_KEYS: dict[str, str] = {
    k: v for k, v in CONTEXT_KEYS.items()
    if k in ("workerInstanceTypes", "masterInstanceTypes", "capacityReservationId",
             "capacityReservationGroupArn", "capacityBlockId", "capacityBlockLeadMinutes",
             "availabilityZones",
             "maxZoneMoves", "launchRetrySeconds")}

#: DLClusterStack's existing-VPC keys.
VPC_KEYS = ExistingVpcKeys(vpc_id="vpcId", vpc_cidr="vpcCidr",
                           private_subnets="vpcPrivateSubnetIds", zones="availabilityZones",
                           file_system="efsFileSystemId", public_subnets="vpcPublicSubnetIds")


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
    _check_nat_gateways(settings, given=ctx.text("natGateways") is not None)
    _check_warm_pool(settings)
    if (settings.capacity_block_lead_minutes != ClusterSettings.capacity_block_lead_minutes
            and not settings.capacity_block_id):
        raise validation.ConfigError(
            f"context key 'capacityBlockLeadMinutes' ({settings.capacity_block_lead_minutes}) "
            "is the lead before a Capacity Block's end; it needs 'capacityBlockId'")
    needed = settings.worker_count + settings.spot_workers
    if settings.max_workers is not None and settings.max_workers < needed:
        raise validation.ConfigError(
            f"context key 'maxWorkers' must be at least workerCount + spotWorkers ({needed}), "
            f"got {settings.max_workers}"
        )
    return settings


def _check_warm_pool(s: ClusterSettings) -> None:
    """AWS refuses a warm pool on a group that launches Spot or has a mixed instances
    policy, and a pool only wastes a Capacity Block (constructs_lib/warm_pool.py): say so
    with the context keys."""
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
    if s.capacity_block_id:
        raise validation.ConfigError(
            f"context key 'warmPoolSize' ({s.warm_pool_size}) cannot be used with "
            f"'capacityBlockId' ({s.capacity_block_id}): a Capacity Block is paid for its "
            "whole duration and holds a fixed number of instances, so a warm pool only keeps "
            "block capacity idle, and EC2 terminates the block's instances before it ends")


def _check_nat_gateways(s: ClusterSettings, *, given: bool) -> None:
    """A NAT gateway per zone at most (CDK's ``Vpc`` puts one in each public subnet), and
    only in the VPC the stack makes: an existing VPC's routes are its owner's."""
    if s.vpc_id and given:
        raise validation.ConfigError(
            f"context key 'natGateways' ({s.nat_gateways}) is for the VPC the stack creates; "
            f"with 'vpcId' ({s.vpc_id}) the private subnets' routes are the VPC's own")
    zones = len(s.availability_zones or ()) or DEFAULT_MAX_AZS
    if s.nat_gateways > zones:
        raise validation.ConfigError(
            f"context key 'natGateways' must be at most the VPC's zones ({zones}: "
            + (f"availabilityZones={','.join(s.availability_zones)}"
               if s.availability_zones else "the region's first two")
            + f"), one NAT gateway per zone; got {s.nat_gateways}")


def _check_existing_vpc(s: ClusterSettings) -> None:
    """The shared existing-VPC rules (stacks/vpc_rules.py), then this stack's own: SSH to
    the master in an imported VPC needs a public subnet to move it to."""
    check_existing_vpc(VPC_KEYS, ExistingVpc(
        vpc_id=s.vpc_id,
        vpc_cidr=None if s.vpc_cidr == ClusterSettings.vpc_cidr else s.vpc_cidr,
        private_subnets=s.vpc_private_subnet_ids, zones=s.availability_zones,
        file_system=s.efs_file_system_id, public_subnets=s.vpc_public_subnet_ids))
    if s.vpc_id and s.ssh_cidr and not s.vpc_public_subnet_ids:
        raise validation.ConfigError(
            f"context key 'sshCidr' with 'vpcId' needs 'vpcPublicSubnetIds' (the master moves "
            f"to a public subnet), got sshCidr={s.ssh_cidr!r}")


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

"""Turn CDK context values (strings from `-c key=value`, or JSON from cdk.json) into settings.

Every bad value fails synth with a message naming the context key and the value; unset keys
keep ClusterSettings' defaults, which are the constructs' own.
"""

from __future__ import annotations

from collections.abc import Callable

from constructs_lib import validation
from constructs_lib.images import IMAGE_FAMILIES, pytorch_version
from stacks.cluster_stack import ClusterSettings
from stacks.context import ContextReader

#: context key -> (ClusterSettings field, meaning). The README's settings table mirrors this.
CONTEXT_KEYS: dict[str, tuple[str, str]] = {
    "workerCount": ("worker_count", "number of worker nodes (the master trains too)"),
    "workerInstanceType": ("worker_instance_type", "EC2 instance type of the workers"),
    "masterInstanceType": ("master_instance_type", "EC2 instance type of the master"),
    "imageType": ("image_type", "Deep Learning AMI family: amazon-linux-2023 | ubuntu"),
    "pytorchVersion": ("pytorch_version", "PyTorch line of the DLAMI (major.minor), part of "
                       "its SSM parameter name; unset: the newest documented for imageType"),
    "amiId": ("ami_id", "custom AMI id, overrides imageType's public DLAMI"),
    "sshCidr": ("ssh_cidr", "CIDR allowed to SSH to the master; unset = no SSH at all"),
    "keyName": ("key_name", "EC2 key pair for SSH; unset = none"),
    "efsFileSystemId": ("efs_file_system_id", "use this existing EFS instead of a new one"),
    "efsMountPoint": ("efs_mount_point", "where EFS is mounted on every node"),
    "vpcCidr": ("vpc_cidr", "CIDR of the new VPC"),
    "rootVolumeGiB": ("root_volume_gib", "encrypted gp3 root volume size, >= 50"),
    "placementGroup": ("placement_group", "true = cluster placement group for all nodes"),
    "maxWorkers": ("max_workers", "most workers dl-scale may add; unset: workerCount + "
                   "spotWorkers (docs/elastic.md)"),
    "spotWorkers": ("spot_workers", "extra Spot workers above the on-demand workerCount"),
    "dataPrepScript": ("data_prep_script", "command or script path every node runs before "
                       "it joins"),
}

#: The capacity keys (README "When capacity is short"), parsed like the keys above.
CAPACITY_CONTEXT_KEYS: dict[str, tuple[str, str]] = {
    "workerInstanceTypes": ("worker_instance_types", "ordered fallback list of worker types "
                            "(comma-separated, first preferred); not with workerInstanceType"),
    "masterInstanceTypes": ("master_instance_types", "ordered fallback list of master types; "
                            "not with masterInstanceType"),
    "capacityReservationId": ("capacity_reservation_id", "launch into this Capacity "
                              "Reservation (cr-...)"),
    "capacityReservationGroupArn": ("capacity_reservation_group_arn", "launch into this "
                                    "Capacity Reservation group (resource group ARN)"),
    "capacityBlockId": ("capacity_block_id", "launch into this Capacity Block for ML (cr-...)"),
    "availabilityZones": ("availability_zones", "zones of the new VPC, in the nodes' order of "
                          "preference (the reservation's zone first)"),
    "maxZoneMoves": ("max_zone_moves", "zone moves of a single-zone cluster when launches "
                     "fail for capacity, before fewer workers"),
}

#: context key -> validator (name, value) -> setting value. Unset keys keep the default.
_CHECKS: dict[str, Callable[[str, object], object]] = {
    "workerCount": validation.positive_int,
    "rootVolumeGiB": validation.root_volume,
    "imageType": lambda n, v: validation.one_of(n, str(v), tuple(IMAGE_FAMILIES)),
    "pytorchVersion": pytorch_version,
    "workerInstanceType": validation.instance_type,
    "masterInstanceType": validation.instance_type,
    "amiId": validation.ami_id,
    "sshCidr": validation.ssh_cidr,
    "keyName": lambda _n, v: v,
    "efsFileSystemId": validation.file_system_id,
    "efsMountPoint": validation.mount_point,
    "vpcCidr": validation.vpc_cidr,
    "maxWorkers": validation.positive_int,
    "spotWorkers": lambda n, v: validation.positive_int(n, v, minimum=0),
    "workerInstanceTypes": validation.instance_types,
    "masterInstanceTypes": validation.instance_types,
    "capacityReservationId": validation.capacity_reservation_id,
    "capacityReservationGroupArn": validation.resource_group_arn,
    "capacityBlockId": validation.capacity_reservation_id,
    "availabilityZones": validation.availability_zones,
    "maxZoneMoves": lambda n, v: validation.positive_int(n, v, minimum=0),
}
_FIELDS = {**CONTEXT_KEYS, **CAPACITY_CONTEXT_KEYS}


def settings_from_context(get: Callable[[str], object]) -> ClusterSettings:
    """Build the stack's settings from a context getter (``app.node.try_get_context``)."""
    ctx = ContextReader(get)
    values: dict[str, object] = {
        _FIELDS[key][0]: ctx.checked(key, check)
        for key, check in _CHECKS.items()
        if ctx.text(key) is not None
    }
    if get("dataPrepScript") is not None:  # a blank one is a mistake, not "unset"
        values["data_prep_script"] = ctx.checked("dataPrepScript", validation.one_line, raw=True)
    if (placement := ctx.flag("placementGroup")) is not None:
        values["placement_group"] = placement
    _one_of(ctx, ("workerInstanceType", "workerInstanceTypes"),
            ("masterInstanceType", "masterInstanceTypes"),
            ("capacityReservationId", "capacityReservationGroupArn", "capacityBlockId"))
    settings = ClusterSettings(**values)  # type: ignore[arg-type]
    needed = settings.worker_count + settings.spot_workers
    if settings.max_workers is not None and settings.max_workers < needed:
        raise validation.ConfigError(
            f"context key 'maxWorkers' must be at least workerCount + spotWorkers ({needed}), "
            f"got {settings.max_workers}"
        )
    return settings


def _one_of(ctx: ContextReader, *groups: tuple[str, ...]) -> None:
    """At most one key of each group is set; the error names the keys and their values."""
    for keys in groups:
        given = [k for k in keys if ctx.text(k) is not None]
        if len(given) > 1:
            raise validation.ConfigError(
                "context keys " + " and ".join(f"'{k}'" for k in given) + " exclude each "
                "other, got " + ", ".join(f"{k}={ctx.text(k)!r}" for k in given))

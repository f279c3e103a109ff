"""Turn CDK context values (strings from `-c key=value`, or JSON from cdk.json) into settings.

Every bad value fails synth with a message naming the context key and the value.
"""

from __future__ import annotations

from collections.abc import Callable

from constructs_lib import validation
from constructs_lib.images import IMAGE_FAMILIES
from stacks.cluster_stack import ClusterSettings

#: context key -> (ClusterSettings field, meaning). The README's settings table mirrors this.
CONTEXT_KEYS: dict[str, tuple[str, str]] = {
    "workerCount": ("worker_count", "number of worker nodes (the master trains too)"),
    "workerInstanceType": ("worker_instance_type", "EC2 instance type of the workers"),
    "masterInstanceType": ("master_instance_type", "EC2 instance type of the master"),
    "imageType": ("image_type", "Deep Learning AMI family: ubuntu | amazon-linux-2023"),
    "amiId": ("ami_id", "custom AMI id, overrides imageType's public DLAMI"),
    "sshCidr": ("ssh_cidr", "CIDR allowed to SSH to the master; unset = no SSH at all"),
    "keyName": ("key_name", "EC2 key pair for SSH; unset = none"),
    "efsFileSystemId": ("efs_file_system_id", "use this existing EFS instead of a new one"),
    "efsMountPoint": ("efs_mount_point", "where EFS is mounted on every node"),
    "vpcCidr": ("vpc_cidr", "CIDR of the new VPC"),
    "rootVolumeGiB": ("root_volume_gib", "encrypted gp3 root volume size, >= 50"),
    "placementGroup": ("placement_group", "true = cluster placement group for all nodes"),
    "maxWorkers": ("max_workers", "most workers dl-scale may add; default workerCount + "
                   "spotWorkers (docs/elastic.md)"),
    "spotWorkers": ("spot_workers", "extra Spot workers above the on-demand workerCount; "
                    "default 0"),
    "dataPrepScript": ("data_prep_script", "command or script path every node runs before "
                       "it joins; default none"),
}

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no", ""}


def _bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise validation.ConfigError(f"context key '{key}' must be true or false, got {value!r}")


def settings_from_context(get: Callable[[str], object]) -> ClusterSettings:
    """Build the stack's settings from a context getter (``app.node.try_get_context``)."""
    defaults = ClusterSettings()
    values: dict[str, object] = {}

    def text(key: str) -> str | None:
        raw = get(key)
        if raw is None:
            return None
        value = str(raw).strip()
        return value or None

    def named(key: str, check: Callable[[str, object], object]) -> object:
        try:
            return check(key, text(key))
        except validation.ConfigError as exc:
            raise validation.ConfigError(f"context key {exc}") from None

    if text("workerCount") is not None:
        values["worker_count"] = named("workerCount", validation.positive_int)
    if text("rootVolumeGiB") is not None:
        values["root_volume_gib"] = named("rootVolumeGiB", validation.root_volume)
    if text("imageType") is not None:
        values["image_type"] = named(
            "imageType", lambda n, v: validation.one_of(n, v, tuple(IMAGE_FAMILIES))
        )
    for key, field in (
        ("workerInstanceType", "worker_instance_type"),
        ("masterInstanceType", "master_instance_type"),
    ):
        if text(key) is not None:
            values[field] = named(key, _instance_type)
    if text("amiId") is not None:
        values["ami_id"] = named("amiId", validation.ami_id)
    if text("sshCidr") is not None:
        values["ssh_cidr"] = named("sshCidr", validation.ssh_cidr)
    if text("keyName") is not None:
        values["key_name"] = text("keyName")
    if text("efsFileSystemId") is not None:
        values["efs_file_system_id"] = named("efsFileSystemId", validation.file_system_id)
    if text("efsMountPoint") is not None:
        values["efs_mount_point"] = named("efsMountPoint", validation.mount_point)
    if text("vpcCidr") is not None:
        values["vpc_cidr"] = named("vpcCidr", validation.vpc_cidr)
    if text("maxWorkers") is not None:
        values["max_workers"] = named("maxWorkers", validation.positive_int)
    if text("spotWorkers") is not None:
        values["spot_workers"] = named(
            "spotWorkers", lambda n, v: validation.positive_int(n, v, minimum=0)
        )
    if get("dataPrepScript") is not None:
        script = get("dataPrepScript")
        if not isinstance(script, str) or not script.strip() or any(
            c in script for c in "\n\r\x00"
        ):
            raise validation.ConfigError(
                "context key 'dataPrepScript' must be one non-empty line (a command or a "
                f"script path), got {script!r}"
            )
        values["data_prep_script"] = script.strip()
    if get("placementGroup") is not None:
        values["placement_group"] = _bool("placementGroup", get("placementGroup"))
    settings = ClusterSettings(**{**defaults.__dict__, **values})
    needed = settings.worker_count + settings.spot_workers
    if settings.max_workers is not None and settings.max_workers < needed:
        raise validation.ConfigError(
            f"context key 'maxWorkers' must be at least workerCount + spotWorkers ({needed}), "
            f"got {settings.max_workers}"
        )
    return settings


def _instance_type(name: str, value: object) -> str:
    text = str(value)
    parts = text.split(".")
    if len(parts) != 2 or not all(p and p.replace("-", "").isalnum() for p in parts):
        raise validation.ConfigError(
            f"'{name}' must be an EC2 instance type like g5.xlarge, got {value!r}"
        )
    return text

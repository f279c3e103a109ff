"""EmrSettings: the one description of DLEmrClusterStack's settings (``-c emr...=value``).

Each field is a :class:`~constructs_lib.setting.Setting` (context key, default, bounds, check,
doc); the defaults are ``EmrDeepLearningCluster``'s own constants, imported below. app.py
parses and checks the ``emr*`` context with it (``stacks.emr_stack``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from bootstrap_scripts.data import checksums
from constructs_lib import validation
from constructs_lib.emr_cluster import (
    DEFAULT_APPLICATIONS,
    DEFAULT_CORE_INSTANCE_COUNT,
    DEFAULT_DATA_CHECKSUMS,
    DEFAULT_INSTANCE_TYPE,
    DEFAULT_RELEASE_LABEL,
    DEFAULT_ROOT_VOLUME_GIB,
)
from constructs_lib.network import DEFAULT_VPC_CIDR
from constructs_lib.setting import setting
from constructs_lib.shared_storage import DEFAULT_MOUNT_POINT

#: Most core nodes a context value accepts: a typo (100000) fails at synth.
MAX_CORE_INSTANCES = 1000
#: EMR's auto-termination idle timeout is at most 7 days.
MAX_IDLE_TIMEOUT_MINUTES = 7 * 24 * 60


def _text(_name: str, value: object) -> str:
    return str(value)


def _names(_name: str, value: object) -> tuple[str, ...]:
    """A comma-separated string (``-c``) or a JSON list (cdk.json)."""
    items = value if isinstance(value, list) else str(value).split(",")
    return tuple(str(a).strip() for a in items if str(a).strip())


def _command(name: str, value: object) -> tuple[str, ...]:
    """A shell-quoted string (``-c``) or a JSON list of words (cdk.json)."""
    if isinstance(value, list):
        return tuple(str(w) for w in value)
    try:
        return tuple(shlex.split(str(value)))
    except ValueError as exc:
        raise validation.ConfigError(
            f"{name} is not a valid command line ({exc}), got {value!r}") from None


@dataclass(frozen=True)
class EmrSettings:
    """DLEmrClusterStack's settings (docs/emr.md "Context keys"); an unset key keeps the
    construct's default."""

    release_label: str = setting("emrReleaseLabel", DEFAULT_RELEASE_LABEL,
                                 "EMR release, emr-7.x or later", _text)
    applications: tuple[str, ...] = setting(
        "emrApplications", DEFAULT_APPLICATIONS, "comma-separated EMR applications", _names,
        raw=True)
    allow_unstable_applications: bool = setting(
        "emrAllowUnstableApplications", False, "true = allow Hue / Zeppelin (known start "
        "failures)", validation.flag)
    primary_instance_type: str = setting(
        "emrPrimaryInstanceType", DEFAULT_INSTANCE_TYPE, "instance type of the primary node",
        validation.instance_type)
    core_instance_type: str = setting(
        "emrCoreInstanceType", DEFAULT_INSTANCE_TYPE, "instance type of the core nodes",
        validation.instance_type)
    core_instance_count: int = setting(
        "emrCoreInstanceCount", DEFAULT_CORE_INSTANCE_COUNT, "number of core nodes",
        validation.count, minimum=1, maximum=MAX_CORE_INSTANCES)
    ami_id: str | None = setting(
        "emrAmiId", None, "custom AMI id (Amazon Linux 2023 based) instead of the DLAMI",
        validation.ami_id)
    root_volume_gib: int = setting(
        "emrRootVolumeGiB", DEFAULT_ROOT_VOLUME_GIB, "root EBS volume size",
        validation.root_volume)
    efs_file_system_id: str | None = setting(
        "emrEfsFileSystemId", None, "use this existing EFS instead of a new one; it lives in "
        "an existing VPC, so it needs `emrVpcId` (the file system's VPC) and its subnets",
        validation.file_system_id)
    vpc_id: str | None = setting(
        "emrVpcId", None, "run in this existing VPC instead of a new one (no lookup); needs "
        "`emrVpcPrivateSubnetIds` and `emrAvailabilityZones`, not `emrVpcCidr`; its private "
        "subnets must carry the tag `for-use-with-amazon-emr-managed-policies=true`",
        validation.vpc_id)
    vpc_private_subnet_ids: tuple[str, ...] | None = setting(
        "emrVpcPrivateSubnetIds", None, "with `emrVpcId`: private subnets (NAT route or "
        "endpoints), one per zone of `emrAvailabilityZones`, same order; the cluster runs in "
        "the first", validation.subnet_ids)
    availability_zones: tuple[str, ...] | None = setting(
        "emrAvailabilityZones", None, "with `emrVpcId`: the zones of `emrVpcPrivateSubnetIds`",
        validation.availability_zones)
    efs_mount_point: str = setting(
        "emrEfsMountPoint", DEFAULT_MOUNT_POINT, "where EFS is mounted on every node",
        validation.mount_point)
    vpc_cidr: str = setting("emrVpcCidr", DEFAULT_VPC_CIDR, "CIDR of the new VPC",
                            validation.vpc_cidr)
    key_name: str | None = setting(
        "emrKeyName", None, "EC2 key pair for SSH; unset = none (use SSM)", _text)
    tls_certificates_s3_url: str | None = setting(
        "emrTlsCertificatesS3Url", None, "s3:// zip of PEM certificates: enables in-transit "
        "encryption", _text)
    training_command: tuple[str, ...] | None = setting(
        "emrTrainingCommand", None, "dl-run arguments for a step at deploy time", _command,
        raw=True)
    idle_timeout_minutes: int | None = setting(
        "emrIdleTimeoutMinutes", None, "terminate after this long idle", validation.count,
        minimum=1, maximum=MAX_IDLE_TIMEOUT_MINUTES)
    data_checksums: str = setting(
        "emrDataChecksums", DEFAULT_DATA_CHECKSUMS, "every node's default of `dl-run "
        "--data-checksums` (a job's own flag still wins): `required` fails a `--data` job's "
        "staging on the first object botocore cannot check against S3's checksum; `warn` "
        "stages those and counts them (DLClusterStack's `dataChecksums`)",
        validation.checksum_mode, accepts=" or ".join(f"`{m}`" for m in checksums.MODES))

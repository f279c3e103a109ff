"""DLEmrClusterStack: the EMR deep-learning cluster, configured from ``emr*`` context.

``emr_settings_from_context`` turns CDK context (strings from ``-c key=value`` or JSON from
cdk.json) into :class:`EmrSettings`; app.py calls it. Every bad value fails synth with a
message naming the context key and the value. docs/emr.md lists the keys.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, fields

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from constructs_lib import EmrDeepLearningCluster, FixedAmi, validation
from constructs_lib.emr_cluster import (
    DEFAULT_APPLICATIONS,
    DEFAULT_CORE_INSTANCE_COUNT,
    DEFAULT_INSTANCE_TYPE,
    DEFAULT_RELEASE_LABEL,
    DEFAULT_ROOT_VOLUME_GIB,
)
from constructs_lib.nag_suppressions import acknowledge_emr_findings
from constructs_lib.network import DEFAULT_VPC_CIDR
from constructs_lib.shared_storage import DEFAULT_MOUNT_POINT
from stacks.context import ContextReader
from stacks.existing import existing_file_system

CLUSTER_ID = "EmrCluster"


@dataclass(frozen=True)
class EmrSettings:
    """The stack's settings (docs/emr.md "Context keys"); unset settings take the
    construct's defaults (the constants imported above)."""

    release_label: str = DEFAULT_RELEASE_LABEL
    applications: tuple[str, ...] = DEFAULT_APPLICATIONS
    allow_unstable_applications: bool = False
    primary_instance_type: str = DEFAULT_INSTANCE_TYPE
    core_instance_type: str = DEFAULT_INSTANCE_TYPE
    core_instance_count: int = DEFAULT_CORE_INSTANCE_COUNT
    ami_id: str | None = None
    root_volume_gib: int = DEFAULT_ROOT_VOLUME_GIB
    efs_file_system_id: str | None = None
    efs_mount_point: str = DEFAULT_MOUNT_POINT
    vpc_cidr: str = DEFAULT_VPC_CIDR
    key_name: str | None = None
    tls_certificates_s3_url: str | None = None
    training_command: tuple[str, ...] | None = None
    idle_timeout_minutes: int | None = None


#: context key -> (EmrSettings field, meaning). docs/emr.md's table mirrors this.
EMR_CONTEXT_KEYS: dict[str, tuple[str, str]] = {
    "emrReleaseLabel": ("release_label", "EMR release, emr-7.x or later"),
    "emrApplications": ("applications", "comma-separated EMR applications (default Hadoop)"),
    "emrAllowUnstableApplications": ("allow_unstable_applications",
                                     "true = allow Hue / Zeppelin (known start failures)"),
    "emrPrimaryInstanceType": ("primary_instance_type", "instance type of the primary node"),
    "emrCoreInstanceType": ("core_instance_type", "instance type of the core nodes"),
    "emrCoreInstanceCount": ("core_instance_count", "number of core nodes (>= 1)"),
    "emrAmiId": ("ami_id", "custom AMI id (Amazon Linux 2023 based) instead of the DLAMI"),
    "emrRootVolumeGiB": ("root_volume_gib", "root EBS volume size, >= 50"),
    "emrEfsFileSystemId": ("efs_file_system_id", "use this existing EFS instead of a new one"),
    "emrEfsMountPoint": ("efs_mount_point", "where EFS is mounted on every node"),
    "emrVpcCidr": ("vpc_cidr", "CIDR of the new VPC"),
    "emrKeyName": ("key_name", "EC2 key pair for SSH; unset = none (use SSM)"),
    "emrTlsCertificatesS3Url": ("tls_certificates_s3_url",
                                "s3:// zip of PEM certificates: enables in-transit encryption"),
    "emrTrainingCommand": ("training_command", "dl-run arguments for a step at deploy time"),
    "emrIdleTimeoutMinutes": ("idle_timeout_minutes", "terminate after this long idle"),
}

#: context key -> validator (name, value) -> setting value. Unset keys keep the default.
_CHECKS: dict[str, Callable[[str, object], object]] = {
    "emrReleaseLabel": lambda _n, v: v,
    "emrPrimaryInstanceType": validation.instance_type,
    "emrCoreInstanceType": validation.instance_type,
    "emrKeyName": lambda _n, v: v,
    "emrTlsCertificatesS3Url": lambda _n, v: v,
    "emrCoreInstanceCount": validation.positive_int,
    "emrRootVolumeGiB": validation.root_volume,
    "emrAmiId": validation.ami_id,
    "emrEfsFileSystemId": validation.file_system_id,
    "emrEfsMountPoint": validation.mount_point,
    "emrVpcCidr": validation.vpc_cidr,
    "emrIdleTimeoutMinutes": validation.positive_int,
}


def emr_settings_from_context(get: Callable[[str], object]) -> EmrSettings:
    """Build the settings from a context getter (``app.node.try_get_context``)."""
    ctx = ContextReader(get)
    text = ctx.text
    values: dict[str, object] = {
        EMR_CONTEXT_KEYS[key][0]: ctx.checked(key, check)
        for key, check in _CHECKS.items()
        if text(key) is not None
    }
    if text("emrApplications") is not None:
        raw = get("emrApplications")
        items = raw if isinstance(raw, list) else str(raw).split(",")
        values["applications"] = tuple(str(a).strip() for a in items if str(a).strip())
    if (allow := ctx.flag("emrAllowUnstableApplications")) is not None:
        values["allow_unstable_applications"] = allow
    if text("emrTrainingCommand") is not None:
        raw = get("emrTrainingCommand")
        try:
            words = [str(w) for w in raw] if isinstance(raw, list) else shlex.split(str(raw))
        except ValueError as exc:
            raise validation.ConfigError(
                f"context key 'emrTrainingCommand' is not a valid command line ({exc}), "
                f"got {raw!r}") from None
        values["training_command"] = tuple(words)
    known = {f.name for f in fields(EmrSettings)}
    return EmrSettings(**{k: v for k, v in values.items() if k in known})


class DLEmrClusterStack(Stack):
    """Deploys one EmrDeepLearningCluster and prints how to reach it and submit training."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: EmrSettings | None = None,
                 **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        s = settings or EmrSettings()
        self.settings = s
        file_system = None
        if s.efs_file_system_id:
            file_system = existing_file_system(
                self, cluster_construct_id=CLUSTER_ID, file_system_id=s.efs_file_system_id,
                cluster_vpc=lambda: self.cluster.vpc)
        self.cluster = EmrDeepLearningCluster(
            self, CLUSTER_ID,
            vpc_cidr=s.vpc_cidr,
            release_label=s.release_label,
            applications=list(s.applications),
            allow_unstable_applications=s.allow_unstable_applications,
            primary_instance_type=s.primary_instance_type,
            core_instance_type=s.core_instance_type,
            core_instance_count=s.core_instance_count,
            machine_image=FixedAmi(s.ami_id) if s.ami_id else None,
            root_volume_gib=s.root_volume_gib,
            file_system=file_system,
            efs_mount_point=s.efs_mount_point,
            key_pair=(ec2.KeyPair.from_key_pair_name(self, "KeyPair", s.key_name)
                      if s.key_name else None),
            tls_certificates_s3_url=s.tls_certificates_s3_url,
            training_command=list(s.training_command) if s.training_command else None,
            idle_timeout=(Duration.minutes(s.idle_timeout_minutes)
                          if s.idle_timeout_minutes else None),
        )
        acknowledge_emr_findings(self.cluster)
        c = self.cluster
        CfnOutput(self, "ClusterId", value=c.cluster_id, description="EMR cluster id (j-...)")
        CfnOutput(self, "LogUri", value=c.log_uri,
                  description="EMR logs: bootstrap actions, steps (dl-run output), nodes")
        CfnOutput(self, "FileSystemId", value=c.file_system.file_system_id,
                  description=f"EFS mounted at {c.efs_mount_point} on every node")
        CfnOutput(self, "SubmitCommand",
                  value=f"dl-submit --emr {c.cluster_id} --region {self.region} --wait -- "
                        "python train.py",
                  description="Run a training job on the cluster as an EMR step")
        primary_instance = (
            f"$(aws emr list-instances --region {self.region} --cluster-id {c.cluster_id} "
            "--instance-group-types MASTER --query 'Instances[0].Ec2InstanceId' --output text)"
        )
        CfnOutput(self, "ConnectCommand",
                  value=f"aws ssm start-session --region {self.region} --target {primary_instance}",
                  description="Open a shell on the primary node (SSM Session Manager, no SSH)")

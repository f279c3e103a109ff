"""DLEmrClusterStack: the EMR deep-learning cluster, configured from ``emr*`` context.

``emr_settings_from_context`` turns CDK context (strings from ``-c key=value`` or JSON from
cdk.json) into :class:`EmrSettings` (``constructs_lib.emr_settings``, where each key is
described once); app.py calls it. Every bad value fails synth with a message naming the
context key, the value and the limit. docs/emr.md lists the keys.
"""

from __future__ import annotations

from collections.abc import Callable

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from constructs_lib import EmrDeepLearningCluster, FixedAmi
from constructs_lib.emr_settings import EmrSettings
from constructs_lib.nag_suppressions import acknowledge_emr_findings
from constructs_lib.setting import context_keys
from stacks.context import ContextReader
from stacks.existing import existing_file_system, existing_vpc
from stacks.vpc_rules import ExistingVpc, ExistingVpcKeys, check_existing_vpc

CLUSTER_ID = "EmrCluster"

__all__ = ["CLUSTER_ID", "EMR_CONTEXT_KEYS", "DLEmrClusterStack", "EmrSettings",
           "emr_settings_from_context"]


#: context key -> EmrSettings field (derived from the field descriptions).
EMR_CONTEXT_KEYS: dict[str, str] = context_keys(EmrSettings)
#: The EMR stack's existing-VPC keys.
EMR_VPC_KEYS = ExistingVpcKeys(vpc_id="emrVpcId", vpc_cidr="emrVpcCidr",
                               private_subnets="emrVpcPrivateSubnetIds",
                               zones="emrAvailabilityZones", file_system="emrEfsFileSystemId")


def emr_settings_from_context(get: Callable[[str], object]) -> EmrSettings:
    """Build the settings from a context getter (``app.node.try_get_context``)."""
    settings = ContextReader(get).settings(EmrSettings)
    _check_existing_vpc(settings)
    return settings


def _check_existing_vpc(s: EmrSettings) -> None:
    """DLClusterStack's existing-VPC rules under the ``emr*`` keys (stacks/vpc_rules.py)."""
    check_existing_vpc(EMR_VPC_KEYS, ExistingVpc(
        vpc_id=s.vpc_id,
        vpc_cidr=None if s.vpc_cidr == EmrSettings.vpc_cidr else s.vpc_cidr,
        private_subnets=s.vpc_private_subnet_ids, zones=s.availability_zones,
        file_system=s.efs_file_system_id), zones_need_vpc=True)


class DLEmrClusterStack(Stack):
    """Deploys one EmrDeepLearningCluster and prints how to reach it and submit training."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: EmrSettings | None = None,
                 **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        s = settings or EmrSettings()
        self.settings = s
        vpc = existing_vpc(self, vpc_id=s.vpc_id, availability_zones=s.availability_zones,
                           private_subnet_ids=s.vpc_private_subnet_ids)
        file_system = None
        if s.efs_file_system_id:
            file_system = existing_file_system(
                self, cluster_construct_id=CLUSTER_ID, file_system_id=s.efs_file_system_id,
                cluster_vpc=lambda: self.cluster.vpc)
        self.cluster = EmrDeepLearningCluster(
            self, CLUSTER_ID,
            vpc=vpc,
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
            data_checksums=s.data_checksums,
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

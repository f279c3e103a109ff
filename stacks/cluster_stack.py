"""DLClusterStack: the deep-learning cluster of the original CloudFormation template."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib import DeepLearningCluster, FixedAmi, acknowledge_cluster_findings
from constructs_lib.cluster_settings import ClusterSettings
from constructs_lib.resume_sources import CheckpointSource, split_url
from stacks.existing import existing_file_system, existing_vpc

CLUSTER_ID = "Cluster"

__all__ = ["CLUSTER_ID", "ClusterSettings", "DLClusterStack"]


class DLClusterStack(Stack):
    """Deploys one DeepLearningCluster and prints what a user needs to reach it."""

    def __init__(
        self, scope: Construct, construct_id: str, *, settings: ClusterSettings, **kwargs
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = s = settings
        vpc = existing_vpc(self, vpc_id=s.vpc_id, availability_zones=s.availability_zones,
                           private_subnet_ids=s.vpc_private_subnet_ids,
                           public_subnet_ids=s.vpc_public_subnet_ids)
        file_system = None
        if s.efs_file_system_id:
            file_system = existing_file_system(
                self, cluster_construct_id=CLUSTER_ID, file_system_id=s.efs_file_system_id,
                cluster_vpc=lambda: self.cluster.vpc,
            )
        self.cluster = DeepLearningCluster(
            self,
            CLUSTER_ID,
            vpc=vpc,
            vpc_cidr=s.vpc_cidr,
            nat_gateways=s.nat_gateways,
            worker_count=s.worker_count,
            worker_instance_type=None if s.worker_instance_types else s.worker_instance_type,
            master_instance_type=None if s.master_instance_types else s.master_instance_type,
            worker_instance_types=s.worker_instance_types,
            master_instance_types=s.master_instance_types,
            capacity_reservation_id=s.capacity_reservation_id,
            capacity_reservation_group_arn=s.capacity_reservation_group_arn,
            capacity_block_id=s.capacity_block_id,
            capacity_block_lead_minutes=s.capacity_block_lead_minutes,
            availability_zones=s.availability_zones,
            max_zone_moves=s.max_zone_moves,
            launch_retry_seconds=s.launch_retry_seconds,
            image_type=s.image_type,
            pytorch_version=s.pytorch_version,
            machine_image=FixedAmi(s.ami_id) if s.ami_id else None,
            ssh_cidr=s.ssh_cidr,
            key_pair=(ec2.KeyPair.from_key_pair_name(self, "KeyPair", s.key_name)
                      if s.key_name else None),
            file_system=file_system,
            efs_mount_point=s.efs_mount_point,
            root_volume_gib=s.root_volume_gib,
            create_placement_group=s.placement_group,
            efa=s.efa,
            max_workers=s.max_workers,
            spot_workers=s.spot_workers,
            warm_pool_size=s.warm_pool_size,
            data_prep_script=s.data_prep_script,
            max_replacements_per_hour=s.max_replacements_per_hour,
            idle_stop_minutes=s.idle_stop_minutes,
            idle_stop_master_minutes=s.idle_stop_master_minutes,
            data_bucket=(s3.Bucket.from_bucket_name(self, "DataBucket", s.data_bucket)
                         if s.data_bucket else None),
            data_prefix=s.data_prefix,
            resume_from=[CheckpointSource(s3.Bucket.from_bucket_name(self, f"ResumeBucket{n}",
                                                                     bucket), prefix)
                         for n, (bucket, prefix) in enumerate(map(split_url, s.resume_from))],
            budget_per_day=s.budget_per_day,
            node_boot_seconds=s.node_boot_seconds,
            log_retention_days=s.log_retention_days,
            alarm_email=s.alarm_email,
            efs_io_alarm_gib_per_hour=s.efs_io_alarm_gib_per_hour,
            cluster_users=s.cluster_users,
            shared_storage=s.shared_storage,
            data_checksums=s.data_checksums,
            scheduler=s.scheduler,
            allowed_images=s.allowed_images,
        )
        acknowledge_cluster_findings(self.cluster)
        c = self.cluster
        master_group = c.master_group.group_name
        CfnOutput(
            self,
            "MasterGroupName",
            value=master_group,
            description="Auto Scaling group of the master node",
        )
        CfnOutput(
            self,
            "WorkerGroupName",
            value=c.worker_group.group_name,
            description="Auto Scaling group of the workers (dl-scale changes its capacity)",
        )
        CfnOutput(
            self,
            "WorkerLaunchTemplateId",
            value=c.worker_group.launch_template.launch_template_id or "",
            description="Launch template to start extra workers by hand",
        )
        CfnOutput(
            self,
            "FileSystemId",
            value=c.file_system.file_system_id,
            description=f"EFS mounted at {c.efs_mount_point} on every node",
        )
        CfnOutput(self, "MasterQueueUrl", value=c.master_queue.queue_url)
        CfnOutput(self, "LogGroupName", value=c.observability.log_group_name,
                  description="Every node's logs, one stream per node and source "
                  "(dlc logs --source cloudwatch)")
        CfnOutput(self, "DashboardName", value=c.observability.dashboard.dashboard_name,
                  description="The cluster's CloudWatch dashboard (dlc status prints its URL)")
        CfnOutput(self, "AlarmTopicArn", value=c.observability.alarm_topic.topic_arn,
                  description="The cluster's alarms (and its daily budget, budgetPerDay) "
                  "publish here; subscribe to be told")
        CfnOutput(self, "WorkdirBucketName", value=c.workdir_staging.bucket_name,
                  description="dlc submit --workdir stages directories here (workdirs/)")
        data = c.training_data
        CfnOutput(
            self,
            "CheckpointBucketName",
            value=data.checkpoint_bucket.bucket_name,
            description=f"Checkpoints in S3 (nodes write under {data.checkpoint_prefix}); "
            "RETAINed: dlc down keeps it unless --delete-data",
        )
        CfnOutput(self, "CheckpointUrl", value=data.checkpoint_url,
                  description="This cluster's checkpoints: give it to a later cluster's "
                  "resumeFrom setting to resume its jobs there (dlc submit --resume-from)")
        if data.data_bucket is not None:
            CfnOutput(
                self,
                "DataBucketName",
                value=data.data_bucket.bucket_name,
                description=f"Training data the nodes may read: {data.data_url} "
                "(dl-run --data stages it to local disk)",
            )
        master_instance = (
            f"$(aws autoscaling describe-auto-scaling-groups --region {self.region} "
            f"--auto-scaling-group-names {master_group} "
            "--query 'AutoScalingGroups[0].Instances[0].InstanceId' --output text)"
        )
        CfnOutput(
            self,
            "ConnectCommand",
            value=f"aws ssm start-session --region {self.region} --target {master_instance}",
            description="Open a shell on the master (SSM Session Manager, no SSH needed)",
        )
        CfnOutput(
            self,
            "OperatorPolicyArn",
            value=c.operator_access.policy_arn,
            description="Managed policy with what dlc needs day to day (docs/dlc.md); attach "
            "it to your operators' role",
        )

"""DLClusterStack: the deep-learning cluster of the original CloudFormation template."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from constructs_lib import DeepLearningCluster, acknowledge_cluster_findings


@dataclass(frozen=True)
class ClusterSettings:
    """The stack's settings, read from CDK context by app.py (README "Settings")."""

    worker_count: int = 2
    worker_instance_type: str = "g5.xlarge"
    master_instance_type: str = "g5.xlarge"
    image_type: str = "ubuntu"
    ami_id: str | None = None
    ssh_cidr: str | None = None
    key_name: str | None = None
    efs_file_system_id: str | None = None
    efs_mount_point: str = "/efs"
    vpc_cidr: str = "10.0.0.0/16"
    root_volume_gib: int = 100
    placement_group: bool = False
    max_workers: int | None = None  # None = worker_count + spot_workers
    spot_workers: int = 0
    data_prep_script: str | None = None


class DLClusterStack(Stack):
    """Deploys one DeepLearningCluster and prints what a user needs to reach it."""

    def __init__(
        self, scope: Construct, construct_id: str, *, settings: ClusterSettings, **kwargs
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        self.cluster = DeepLearningCluster(
            self,
            "Cluster",
            vpc_cidr=settings.vpc_cidr,
            worker_count=settings.worker_count,
            worker_instance_type=settings.worker_instance_type,
            master_instance_type=settings.master_instance_type,
            image_type=settings.image_type,
            ami_id=settings.ami_id,
            ssh_cidr=settings.ssh_cidr,
            key_name=settings.key_name,
            efs_file_system_id=settings.efs_file_system_id,
            efs_mount_point=settings.efs_mount_point,
            root_volume_gib=settings.root_volume_gib,
            placement_group=settings.placement_group,
            max_workers=settings.max_workers,
            spot_workers=settings.spot_workers,
            data_prep_script=settings.data_prep_script,
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
        CfnOutput(self, "WorkerQueueUrl", value=c.worker_queue.queue_url)
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

"""The construct library's API: typed references, import helpers, errors that name the
construct, and every optional prop documented with its default."""

from __future__ import annotations

import inspect
import json
import re

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Match, Template

from constructs_lib import (
    CapacityAdjuster,
    ClusterNetwork,
    ConfigError,
    DeepLearningCluster,
    EmrDeepLearningCluster,
    FixedAmi,
    MetadataQueues,
    NodeGroup,
    SharedFileSystem,
)
from tests.stack.synth import new_app

CONSTRUCTS = (CapacityAdjuster, ClusterNetwork, DeepLearningCluster, EmrDeepLearningCluster,
              MetadataQueues, NodeGroup, SharedFileSystem)


def _statements(template: Template, role_fragment: str) -> list[dict]:
    return [st for lid, p in template.find_resources("AWS::IAM::Policy").items()
            if role_fragment in lid for st in p["Properties"]["PolicyDocument"]["Statement"]]


def test_typed_instance_types_images_key_pairs_and_a_new_placement_group() -> None:
    stack = cdk.Stack(new_app(), "Typed")
    cluster = DeepLearningCluster(
        stack, "Cluster",
        worker_instance_type=ec2.InstanceType("g5.12xlarge"),
        master_instance_type=ec2.InstanceType.of(ec2.InstanceClass.G5, ec2.InstanceSize.XLARGE2),
        machine_image=FixedAmi("ami-0123456789abcdef0"),
        key_pair=ec2.KeyPair.from_key_pair_name(stack, "Ops", "ops"),
        create_placement_group=True,
    )
    assert isinstance(cluster.placement_group, ec2.PlacementGroup)
    template = Template.from_stack(stack)
    data = {lid: lt["Properties"]["LaunchTemplateData"]
            for lid, lt in template.find_resources("AWS::EC2::LaunchTemplate").items()}
    assert sorted(d["InstanceType"] for d in data.values()) == ["g5.12xlarge", "g5.2xlarge"]
    for d in data.values():
        assert d["ImageId"] == "ami-0123456789abcdef0" and d["KeyName"] == "ops"
        assert "Placement" not in d  # a new placement group is the groups' (one per zone)
    template.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup",
                                     {"PlacementGroup": Match.any_value()})
    # The node roles mount through CDK's own grant (file_system.grant_root_access).
    (efs_grant,) = [st for st in _statements(template, "WorkerGroup")
                    if "elasticfilesystem:ClientRootAccess" in st["Action"]]
    (fs_id,) = template.find_resources("AWS::EFS::FileSystem")
    assert efs_grant["Resource"] == {"Fn::GetAtt": [fs_id, "Arn"]}
    assert efs_grant["Condition"] == {
        "Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}


def test_existing_file_system_placement_group_and_role() -> None:
    stack = cdk.Stack(new_app(), "Existing")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    mount_targets = ec2.SecurityGroup(stack, "MountTargets", vpc=vpc, allow_all_outbound=False)
    fs = SharedFileSystem.from_file_system_id(
        stack, "Data", file_system_id="fs-0123456789abcdef0", security_group=mount_targets)
    placement = ec2.PlacementGroup(stack, "Placement", strategy=ec2.PlacementGroupStrategy.CLUSTER)
    cluster = DeepLearningCluster(stack, "Cluster", vpc=vpc, file_system=fs,
                                  placement_group=placement)
    assert cluster.storage is None and cluster.file_system is fs
    assert cluster.placement_group is placement
    role = iam.Role(stack, "OwnRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    extra = NodeGroup(
        stack, "Extra", node_type="worker", cluster_id="c", vpc=vpc,
        vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        instance_type="g5.xlarge", machine_image=FixedAmi("ami-0123456789abcdef0"),
        user_data=ec2.UserData.for_linux(), security_groups=[cluster.node_security_group],
        notification_topic=sns.Topic(stack, "Topic"), min_capacity=0, max_capacity=1,
        desired_capacity=0, role=role)
    assert extra.role is role

    template = Template.from_stack(stack)
    template.resource_count_is("AWS::EFS::FileSystem", 0)
    template.resource_count_is("AWS::EC2::PlacementGroup", 1)
    assert not [lid for lid in template.find_resources("AWS::IAM::Role")
                if lid.startswith("ExtraInstanceRole")]
    # NFS opened on the imported file system's group, from the nodes only.
    template.has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "FromPort": 2049, "ToPort": 2049,
        "GroupId": stack.resolve(mount_targets.security_group_id),
        "SourceSecurityGroupId": stack.resolve(cluster.node_security_group.security_group_id)})
    (efs_grant,) = [st for st in _statements(template, "MasterGroup")
                    if "elasticfilesystem:ClientMount" in st["Action"]]
    assert "file-system/fs-0123456789abcdef0" in json.dumps(efs_grant["Resource"])


def test_import_helper_creates_the_access_group_in_a_vpc() -> None:
    stack = cdk.Stack(new_app(), "Import")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    fs = SharedFileSystem.from_file_system_id(
        stack, "Data", file_system_id="fs-0123456789abcdef0", vpc=vpc)
    (group,) = fs.connections.security_groups
    assert group.node.path == "Import/Data/MountTargetAccess"
    assert fs.file_system_id == "fs-0123456789abcdef0"


@pytest.mark.parametrize(("build", "message"), [
    (lambda s: DeepLearningCluster(s, "Cluster", worker_count=0),
     "DLClusterStack/Cluster: worker_count must be an integer >= 1, got 0"),
    (lambda s: DeepLearningCluster(s, "Cluster", worker_instance_type="g5"),
     "DLClusterStack/Cluster: worker_instance_type must be an EC2 instance type like "
     "g5.xlarge (family.size, the size one of nano, micro, small, medium, large, xlarge, "
     "<N>xlarge, metal), got 'g5'"),
    (lambda s: DeepLearningCluster(s, "Cluster", placement_group=True),
     "DLClusterStack/Cluster: placement_group takes an ec2.IPlacementGroup; for a new cluster "
     "placement group pass create_placement_group=True, got True"),
    (lambda s: DeepLearningCluster(
        s, "Cluster", create_placement_group=True,
        placement_group=ec2.PlacementGroup(s, "Pg")),
     "DLClusterStack/Cluster: give either placement_group or create_placement_group=True, "
     "not both"),
    (lambda s: DeepLearningCluster(s, "Cluster", data_checksums="strict"),
     "DLClusterStack/Cluster: data_checksums must be one of warn, required, got 'strict'"),
    (lambda s: DeepLearningCluster(s, "Cluster", efs_mount_point="efs"),
     "DLClusterStack/Cluster: efs_mount_point must be an absolute directory path such as "
     "/efs, got 'efs'"),
    (lambda s: SharedFileSystem(s, "Fs", vpc=ec2.Vpc(s, "Vpc"), mount_point="/"),
     "DLClusterStack/Fs: mount_point must be an absolute directory path such as /efs, got '/'"),
    (lambda s: SharedFileSystem.from_file_system_id(s, "Data", file_system_id="fs-0123abcd"),
     "DLClusterStack/Data: give the mount targets' security_group, or the vpc to create one in"),
    (lambda s: SharedFileSystem.from_file_system_id(s, "Data", file_system_id="efs-1",
                                                    vpc=ec2.Vpc(s, "Vpc")),
     "DLClusterStack/Data: file_system_id must look like fs-0123456789abcdef0, got 'efs-1'"),
    (lambda s: ClusterNetwork(s, "Network", cidr="10.0.0.0/8"),
     "DLClusterStack/Network: cidr must have a prefix between /16 and /24, got '10.0.0.0/8'"),
    (lambda s: FixedAmi("ubuntu-24"),
     "ami_id must look like ami-0123456789abcdef0, got 'ubuntu-24'"),
])
def test_errors_name_the_construct_the_prop_and_the_value(build, message: str) -> None:
    stack = cdk.Stack(new_app(), "DLClusterStack")
    with pytest.raises(ConfigError) as err:
        build(stack)
    assert str(err.value) == message


def test_a_file_system_brings_its_own_security_groups() -> None:
    stack = cdk.Stack(new_app(), "DLClusterStack")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    group = ec2.SecurityGroup(stack, "Sg", vpc=vpc)
    fs = SharedFileSystem.from_file_system_id(
        stack, "Data", file_system_id="fs-0123abcd", security_group=group)
    with pytest.raises(ConfigError, match=r"^DLClusterStack/Cluster: efs_security_group is for "):
        DeepLearningCluster(stack, "Cluster", vpc=vpc, file_system=fs, efs_security_group=group)


@pytest.mark.parametrize("construct", CONSTRUCTS, ids=lambda c: c.__name__)
def test_every_prop_is_documented_and_every_optional_one_with_its_default(construct) -> None:
    """Like aws-cdk-lib's ``@default``: ``:param name:`` for every prop, and ``:default:`` in
    the entry of every prop that has one."""
    init = construct.__init__
    doc = inspect.getdoc(init) or ""
    entries = dict(re.findall(r"^:param (\w+):(.*?)(?=^:param |\Z)", doc, re.S | re.M))
    for name, param in inspect.signature(init).parameters.items():
        if param.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        assert name in entries, f"{construct.__name__}: prop {name} is not documented"
        if param.default is not inspect.Parameter.empty:
            assert ":default:" in entries[name], (
                f"{construct.__name__}: prop {name} does not document its default")

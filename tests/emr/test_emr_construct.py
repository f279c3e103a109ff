"""EmrDeepLearningCluster: fine-grained assertions on the synthesised template."""

from __future__ import annotations

import json
import re

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Match, Template

from constructs_lib import ConfigError, EmrDeepLearningCluster, FixedAmi, SharedFileSystem
from constructs_lib.emr_cluster import (
    DEFAULT_RELEASE_LABEL,
    EFS_MOUNT_SCRIPT,
    EMR_MANAGED_POLICY_TAG,
    METADATA_SCRIPT,
)
from constructs_lib.images import IMAGE_FAMILIES
from constructs_lib.package_paths import node_scripts_dir
from tests.emr.conftest import Synth, cdk_context

DLAMI_AL2023 = IMAGE_FAMILIES["amazon-linux-2023"].ssm_parameter(
    IMAGE_FAMILIES["amazon-linux-2023"].default_pytorch)


def ref(logical_id: str) -> dict:
    return {"Ref": logical_id}


def logical_id(synth: Synth, resource_type: str, contains: str = "") -> str:
    ids = [k for k in synth.template.find_resources(resource_type) if contains in k]
    assert len(ids) == 1, f"{resource_type} matching {contains!r}: {ids}"
    return ids[0]


def sg_id(synth: Synth, contains: str) -> dict:
    return {"Fn::GetAtt": [logical_id(synth, "AWS::EC2::SecurityGroup", contains), "GroupId"]}


# -- the cluster ------------------------------------------------------------------------------


def test_custom_ami_is_the_al2023_dlami_from_its_public_ssm_parameter(
        default_synth: Synth) -> None:
    params = default_synth.template.to_json()["Parameters"]
    ami_ref = default_synth.cluster()["CustomAmiId"]
    assert params[ami_ref["Ref"]]["Default"] == DLAMI_AL2023
    assert params[ami_ref["Ref"]]["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"


def test_explicit_ami_id_is_used_as_is(custom_synth: Synth) -> None:
    assert custom_synth.cluster()["CustomAmiId"] == "ami-0123456789abcdef0"


def test_release_label_and_minimal_applications_by_default(default_synth: Synth) -> None:
    props = default_synth.cluster()
    assert props["ReleaseLabel"] == DEFAULT_RELEASE_LABEL
    assert DEFAULT_RELEASE_LABEL.startswith("emr-7.")
    assert props["Applications"] == [{"Name": "Hadoop"}]


def test_uniform_instance_groups_one_primary_n_core(default_synth: Synth,
                                                    custom_synth: Synth) -> None:
    instances = default_synth.cluster()["Instances"]
    assert "MasterInstanceFleet" not in instances and "CoreInstanceFleet" not in instances
    assert instances["MasterInstanceGroup"] == {
        "InstanceCount": 1, "InstanceType": "g5.xlarge", "Market": "ON_DEMAND",
        "Name": "Primary"}
    assert instances["CoreInstanceGroup"] == {
        "InstanceCount": 2, "InstanceType": "g5.xlarge", "Market": "ON_DEMAND", "Name": "Core"}
    custom = custom_synth.cluster()["Instances"]
    assert custom["MasterInstanceGroup"]["InstanceType"] == "g5.2xlarge"
    assert custom["CoreInstanceGroup"]["InstanceType"] == "p4d.24xlarge"
    assert custom["CoreInstanceGroup"]["InstanceCount"] == 4


def test_root_volume_size(default_synth: Synth, custom_synth: Synth) -> None:
    assert default_synth.cluster()["EbsRootVolumeSize"] == 100
    assert custom_synth.cluster()["EbsRootVolumeSize"] == 200


def test_private_subnet_no_key_pair_cluster_stays_up(default_synth: Synth) -> None:
    instances = default_synth.cluster()["Instances"]
    subnet = instances["Ec2SubnetId"]["Ref"]
    assert "privateSubnet" in subnet
    assert "Ec2KeyName" not in instances
    assert instances["KeepJobFlowAliveWhenNoSteps"] is True
    assert instances["TerminationProtected"] is False


def test_bootstrap_actions_mount_efs_then_set_up_membership(default_synth: Synth) -> None:
    mount, membership = default_synth.cluster()["BootstrapActions"]
    fs = logical_id(default_synth, "AWS::EFS::FileSystem")
    assert mount["Name"] == "Mount EFS"
    action = mount["ScriptBootstrapAction"]
    assert action["Args"] == [ref(fs), ref("AWS::Region"), "/efs"]
    assert re.fullmatch(
        r"s3://cdk-hnb659fds-assets-\$\{AWS::AccountId\}-\$\{AWS::Region\}/[0-9a-f]{64}\.sh",
        action["Path"]["Fn::Sub"])

    second = membership["ScriptBootstrapAction"]
    assert membership["Name"] == "Cluster membership"
    assert second["Path"]["Fn::Sub"].endswith(".py")
    args = second["Args"]
    assert args[0] == "bootstrap"
    assert args[args.index("--scripts-url") + 1]["Fn::Sub"].endswith(".zip")
    assert args[args.index("--region") + 1] == ref("AWS::Region")
    assert args[args.index("--efs-mount") + 1] == "/efs"
    assert args[args.index("--python") + 1] == "/opt/pytorch/bin/python"
    # the nodes' default dl-run --data-checksums, as on the EC2 cluster: the node's own
    assert args[args.index("--data-checksums") + 1] == "warn"


def test_the_clusters_data_checksums_reach_the_bootstrap_action(custom_synth: Synth) -> None:
    """``emrDataChecksums=required`` goes to every node's bootstrap action, which writes it
    where dl-run reads it (tests/emr/test_emr_metadata.py)."""
    _mount, membership = custom_synth.cluster()["BootstrapActions"]
    args = membership["ScriptBootstrapAction"]["Args"]
    assert args[args.index("--data-checksums") + 1] == "required"


def test_bootstrap_assets_are_the_shipped_scripts(default_synth: Synth) -> None:
    """The .sh/.py objects the actions point at hold exactly the package's scripts."""
    mount, membership = default_synth.cluster()["BootstrapActions"]
    assert (EFS_MOUNT_SCRIPT, METADATA_SCRIPT) == ("emr/efs_mount.sh", "emr/metadata.py")
    for action, name in ((mount, EFS_MOUNT_SCRIPT), (membership, METADATA_SCRIPT)):
        asset_name = action["ScriptBootstrapAction"]["Path"]["Fn::Sub"].rsplit("/", 1)[1]
        shipped = (default_synth.outdir / f"asset.{asset_name}")
        assert shipped.read_bytes() == (node_scripts_dir() / name).read_bytes()


def test_efs_security_group_is_an_additional_group_on_primary_and_core(
        default_synth: Synth) -> None:
    instances = default_synth.cluster()["Instances"]
    efs_sg = sg_id(default_synth, "SharedStorageMountTargets")
    assert instances["AdditionalMasterSecurityGroups"] == [efs_sg]
    assert instances["AdditionalSlaveSecurityGroups"] == [efs_sg]
    # ... and lets its own members reach NFS.
    default_synth.template.has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "IpProtocol": "tcp", "FromPort": 2049, "ToPort": 2049,
        "GroupId": efs_sg, "SourceSecurityGroupId": efs_sg})


def test_emr_managed_groups_and_service_access_in_private_subnet(default_synth: Synth) -> None:
    instances = default_synth.cluster()["Instances"]
    assert instances["EmrManagedMasterSecurityGroup"] == sg_id(default_synth, "PrimarySecurity")
    assert instances["EmrManagedSlaveSecurityGroup"] == sg_id(default_synth, "CoreSecurity")
    assert instances["ServiceAccessSecurityGroup"] == sg_id(default_synth, "ServiceAccess")
    default_synth.template.has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "IpProtocol": "tcp", "FromPort": 9443, "ToPort": 9443,
        "GroupId": sg_id(default_synth, "ServiceAccess"),
        "SourceSecurityGroupId": sg_id(default_synth, "PrimarySecurity")})
    # Nothing is open to the world.
    for sg in default_synth.template.find_resources("AWS::EC2::SecurityGroup").values():
        for rule in sg["Properties"].get("SecurityGroupIngress", []):
            assert rule.get("CidrIp") != "0.0.0.0/0"
    # EMR's managed policy v2 only works with resources carrying its tag.
    for contains in ("PrimarySecurity", "CoreSecurity", "ServiceAccess"):
        sg = default_synth.resources[logical_id(default_synth, "AWS::EC2::SecurityGroup",
                                                contains)]
        assert {"Key": EMR_MANAGED_POLICY_TAG, "Value": "true"} in sg["Properties"]["Tags"]
    default_synth.template.has_resource_properties("AWS::EC2::Subnet", {
        "Tags": Match.array_with([{"Key": EMR_MANAGED_POLICY_TAG, "Value": "true"}])})


# -- encryption and logging -------------------------------------------------------------------


def security_configuration(synth: Synth) -> dict:
    _, sc = synth.only("AWS::EMR::SecurityConfiguration")
    doc = sc["Properties"]["SecurityConfiguration"]
    return json.loads(doc) if isinstance(doc, str) else doc


def test_security_configuration_encrypts_at_rest_and_requires_imdsv2(
        default_synth: Synth) -> None:
    cluster = default_synth.cluster()
    sc_id = logical_id(default_synth, "AWS::EMR::SecurityConfiguration")
    assert cluster["SecurityConfiguration"] == ref(sc_id)
    doc = security_configuration(default_synth)
    enc = doc["EncryptionConfiguration"]
    assert enc["EnableAtRestEncryption"] is True
    assert enc["AtRestEncryptionConfiguration"]["S3EncryptionConfiguration"] == {
        "EncryptionMode": "SSE-S3"}
    key = logical_id(default_synth, "AWS::KMS::Key", "LocalDiskKey")
    assert enc["AtRestEncryptionConfiguration"]["LocalDiskEncryptionConfiguration"] == {
        "EncryptionKeyProviderType": "AwsKms", "AwsKmsKey": {"Fn::GetAtt": [key, "Arn"]},
        "EnableEbsEncryption": True}
    # No certificate given: in-transit encryption off (it needs one), and said so.
    assert enc["EnableInTransitEncryption"] is False
    assert "InTransitEncryptionConfiguration" not in enc
    assert doc["InstanceMetadataServiceConfiguration"] == {
        "MinimumInstanceMetadataServiceVersion": 2, "HttpPutResponseHopLimit": 2}
    default_synth.template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_in_transit_encryption_with_user_certificates(custom_synth: Synth) -> None:
    enc = security_configuration(custom_synth)["EncryptionConfiguration"]
    assert enc["EnableInTransitEncryption"] is True
    assert enc["InTransitEncryptionConfiguration"] == {"TLSCertificateConfiguration": {
        "CertificateProviderType": "PEM", "S3Object": "s3://my-certs/emr/tls.zip"}}
    # The nodes may read exactly that object.
    custom_synth.template.has_resource_properties("AWS::IAM::Policy", {
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Sid": "ReadTlsCertificates", "Action": "s3:GetObject",
            "Resource": {"Fn::Join": ["", ["arn:", ref("AWS::Partition"),
                                           ":s3:::my-certs/emr/tls.zip"]]}})])}})


def test_log_uri_is_an_encrypted_tls_only_private_bucket(default_synth: Synth) -> None:
    bucket = logical_id(default_synth, "AWS::S3::Bucket", "LogBucket")
    assert default_synth.cluster()["LogUri"] == {
        "Fn::Join": ["", ["s3://", ref(bucket), "/emr-logs/"]]}
    props = default_synth.resources[bucket]["Properties"]
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True}
    default_synth.template.has_resource_properties("AWS::S3::BucketPolicy", {
        "Bucket": ref(bucket),
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Effect": "Deny", "Action": "s3:*",
            "Condition": {"Bool": {"aws:SecureTransport": "false"}}})])}})


# -- roles ------------------------------------------------------------------------------------


def managed_policies(synth: Synth, contains: str) -> list[str]:
    role = synth.resources[logical_id(synth, "AWS::IAM::Role", contains)]
    return [p["Fn::Join"][1][-1] for p in role["Properties"].get("ManagedPolicyArns", [])]


def policy_statements(synth: Synth, role_contains: str) -> dict[str, dict]:
    """The role's statements by Sid (CDK's own grants have none: numbered instead)."""
    role = logical_id(synth, "AWS::IAM::Role", role_contains)
    for policy in synth.template.find_resources("AWS::IAM::Policy").values():
        if ref(role) in policy["Properties"]["Roles"]:
            statements = policy["Properties"]["PolicyDocument"]["Statement"]
            return {s.get("Sid", f"#{i}"): s for i, s in enumerate(statements)}
    raise AssertionError(f"no policy on {role}")


def test_roles_avoid_the_broad_emr_defaults(default_synth: Synth) -> None:
    assert managed_policies(default_synth, "EmrClusterInstanceRole") == [
        ":iam::aws:policy/AmazonSSMManagedInstanceCore"]
    assert managed_policies(default_synth, "EmrClusterServiceRole") == [
        ":iam::aws:policy/service-role/AmazonEMRServicePolicy_v2"]
    text = json.dumps(default_synth.resources)
    assert "AmazonElasticMapReduceforEC2Role" not in text
    assert "AmazonElasticMapReduceRole" not in text
    cluster = default_synth.cluster()
    assert cluster["JobFlowRole"] == ref(logical_id(default_synth, "AWS::IAM::InstanceProfile"))
    assert cluster["ServiceRole"] == ref(logical_id(default_synth, "AWS::IAM::Role",
                                                    "EmrClusterServiceRole"))


def test_instance_role_grants_exactly_what_the_node_scripts_use(default_synth: Synth) -> None:
    s = policy_statements(default_synth, "EmrClusterInstanceRole")
    assert s["ReadBootstrapScripts"]["Action"] == "s3:GetObject"
    assert len(s["ReadBootstrapScripts"]["Resource"]) == 3  # the three asset objects only
    assert s["ListOwnClusterInstances"]["Condition"] == {"StringEquals": {
        "elasticmapreduce:ResourceTag/dl-cluster:id": "DLEmrClusterStack"}}
    assert sorted(s["ListOwnClusterInstances"]["Action"]) == [
        "elasticmapreduce:DescribeCluster", "elasticmapreduce:ListInstances"]
    assert s["GpuCountsOfInstanceTypes"]["Action"] == "ec2:DescribeInstanceTypes"
    # The file system's own grants (efs.FileSystem.grant / grant_root_access): its ARN.
    fs_arn = {"Fn::GetAtt": [logical_id(default_synth, "AWS::EFS::FileSystem"), "Arn"]}
    (mount,) = [st for st in s.values() if "elasticfilesystem:ClientRootAccess" in st["Action"]]
    assert sorted(mount["Action"]) == ["elasticfilesystem:ClientMount",
                                       "elasticfilesystem:ClientRootAccess",
                                       "elasticfilesystem:ClientWrite"]
    assert mount["Resource"] == fs_arn
    assert mount["Condition"] == {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}
    (wait,) = [st for st in s.values()
               if "elasticfilesystem:DescribeMountTargets" in st["Action"]]
    assert wait["Resource"] == fs_arn
    assert s["WriteClusterLogs"]["Action"] == "s3:PutObject"
    assert s["WriteClusterLogs"]["Resource"]["Fn::Join"][1][-1] == "/emr-logs/*"
    assert default_synth.cluster()["Tags"][0] == {"Key": "dl-cluster:id",
                                                  "Value": "DLEmrClusterStack"}


def test_service_role_passes_only_the_instance_role(default_synth: Synth) -> None:
    s = policy_statements(default_synth, "EmrClusterServiceRole")
    role = logical_id(default_synth, "AWS::IAM::Role", "EmrClusterInstanceRole")
    assert s["PassInstanceRole"]["Resource"] == {"Fn::GetAtt": [role, "Arn"]}
    assert "kms:CreateGrant" in s["EncryptNodeVolumes"]["Action"]


def test_cluster_waits_for_policies_and_mount_targets(default_synth: Synth) -> None:
    _, cluster = default_synth.only("AWS::EMR::Cluster")
    depends = set(cluster["DependsOn"])
    assert set(default_synth.template.find_resources("AWS::EFS::MountTarget")) <= depends
    # (not the teardown function's: it acts only after the cluster is deleted)
    assert set(default_synth.template.find_resources("AWS::IAM::Policy")) - {
        k for k in default_synth.template.find_resources("AWS::IAM::Policy")
        if "Vpc" in k or "SecurityGroupRelease" in k
    } <= depends


def test_stateful_logical_ids_are_pinned(default_synth: Synth) -> None:
    """Renaming these would replace the file system, the logs and the disk key."""
    for resource_type, expected in (
            ("AWS::EFS::FileSystem", "EmrClusterSharedStorageFileSystem3DF6E779"),
            ("AWS::S3::Bucket", "EmrClusterLogBucket3857E112"),
            ("AWS::KMS::Key", "EmrClusterLocalDiskKeyC61DD072")):
        assert expected in default_synth.template.find_resources(resource_type)
        assert default_synth.resources[expected]["DeletionPolicy"] == "Retain"
    assert list(default_synth.template.find_resources("AWS::EMR::Cluster")) == [
        "EmrCluster58CC5E16"]


# -- optional parts ---------------------------------------------------------------------------


def test_training_step_at_deploy_time_runs_dl_run_with_command_runner(
        default_synth: Synth, custom_synth: Synth) -> None:
    assert "Steps" not in default_synth.cluster()
    assert custom_synth.cluster()["Steps"] == [{
        "Name": "dl-run (deploy-time training)", "ActionOnFailure": "CONTINUE",
        "HadoopJarStep": {"Jar": "command-runner.jar", "Args": [
            "/usr/local/bin/dl-run", "python", "train.py", "--epochs", "3"]}}]


def test_existing_file_system_is_not_created_but_mounted(custom_synth: Synth) -> None:
    custom_synth.template.resource_count_is("AWS::EFS::FileSystem", 0)
    mount = custom_synth.cluster()["BootstrapActions"][0]["ScriptBootstrapAction"]
    assert mount["Args"][0] == "fs-0123456789abcdef0"
    efs_sg = sg_id(custom_synth, "SharedStorageMountTargetAccess")
    assert custom_synth.cluster()["Instances"]["AdditionalSlaveSecurityGroups"] == [efs_sg]


def test_allowed_unstable_applications_and_other_settings(custom_synth: Synth) -> None:
    props = custom_synth.cluster()
    assert props["Applications"] == [{"Name": "Hadoop"}, {"Name": "Spark"}, {"Name": "Hue"}]
    assert props["Instances"]["Ec2KeyName"] == "ops"
    assert props["AutoTerminationPolicy"] == {"IdleTimeout": 7200}


def test_construct_accepts_interfaces_for_vpc_file_system_and_bucket() -> None:
    app = cdk.App(context=cdk_context())
    stack = cdk.Stack(app, "Host")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    fs = efs.FileSystem(stack, "Fs", vpc=vpc)
    logs = s3.Bucket(stack, "Logs", enforce_ssl=True)
    emr = EmrDeepLearningCluster(
        stack, "Emr", vpc=vpc, file_system=fs, log_bucket=logs, core_instance_count=1,
        core_instance_type=ec2.InstanceType("g5.12xlarge"),
        machine_image=FixedAmi("ami-0123456789abcdef0"),
        key_pair=ec2.KeyPair.from_key_pair_name(stack, "Ops", "ops"))
    assert emr.storage is None and emr.file_system is fs and emr.log_bucket is logs
    template = Template.from_stack(stack)
    cluster = next(iter(template.find_resources("AWS::EMR::Cluster").values()))["Properties"]
    assert cluster["Instances"]["CoreInstanceGroup"]["InstanceType"] == "g5.12xlarge"
    assert cluster["Instances"]["Ec2KeyName"] == "ops"
    assert cluster["CustomAmiId"] == "ami-0123456789abcdef0"
    template.resource_count_is("AWS::EFS::FileSystem", 1)
    template.resource_count_is("AWS::S3::Bucket", 1)
    props = next(iter(template.find_resources("AWS::EMR::Cluster").values()))["Properties"]
    fs_sg = stack.resolve(fs.connections.security_groups[0].security_group_id)
    assert props["Instances"]["AdditionalMasterSecurityGroups"] == [fs_sg]
    assert props["LogUri"] == {"Fn::Join": ["", ["s3://", stack.resolve(logs.bucket_name),
                                                 "/emr-logs/"]]}
    assert len(emr.connections.security_groups) == 2


# -- bad props: clear synth errors -------------------------------------------------------------


def build(**props):
    app = cdk.App(context=cdk_context())
    stack = cdk.Stack(app, "Bad")
    return EmrDeepLearningCluster(stack, "Emr", **props)


@pytest.mark.parametrize(("props", "pattern"), [
    ({"root_volume_gib": 49}, r"^Bad/Emr: root_volume_gib must be at least 50 GiB .* got 49$"),
    ({"applications": ["Hadoop", "Hue"]},
     r"applications contains 'Hue': Hue failed to start .*allow_unstable_applications=True"),
    ({"applications": ["Zeppelin"]}, r"'Zeppelin': Zeppelin failed to start"),
    ({"applications": ["Hadoop", "Sparkk"]}, r"contains 'Sparkk', which is not an EMR 7 app"),
    ({"applications": "Spark"}, r"applications must be a list of names, got the string"),
    ({"release_label": "emr-6.15.0"}, r"emr-7.x release or later .* got 'emr-6.15.0'"),
    ({"release_label": "7.12"}, r"^Bad/Emr: release_label must look like emr-7.12.0, got '7.12'$"),
    ({"core_instance_count": 0}, r"^Bad/Emr: core_instance_count must be an integer >= 1, got 0$"),
    ({"core_instance_type": "g5-xlarge"}, r"core_instance_type must be an EC2 instance type"),
    ({"tls_certificates_s3_url": "https://x/y.zip"},
     r"tls_certificates_s3_url must be an S3 object URL .* got 'https://x/y.zip'"),
    ({"training_command": "python train.py"}, r"training_command must be a non-empty list"),
    ({"training_command": []}, r"training_command must be a non-empty list"),
    ({"efs_mount_point": "efs"}, r"^Bad/Emr: efs_mount_point must be an absolute directory"),
    ({"idle_timeout": cdk.Duration.seconds(10)}, r"idle_timeout must be between 1 minute"),
    ({"data_checksums": "strict"},
     r"^Bad/Emr: data_checksums must be one of warn, required, got 'strict'$"),
])
def test_bad_props_fail_synth_naming_the_value(props: dict, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        build(**props)


def test_a_file_system_brings_its_own_security_groups() -> None:
    app = cdk.App(context=cdk_context())
    stack = cdk.Stack(app, "Both")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    group = ec2.SecurityGroup(stack, "Sg", vpc=vpc)
    fs = SharedFileSystem.from_file_system_id(
        stack, "Data", file_system_id="fs-0123456789abcdef0", security_group=group)
    with pytest.raises(ConfigError, match=r"^Both/Emr: efs_security_group is for the file "):
        EmrDeepLearningCluster(stack, "Emr", vpc=vpc, file_system=fs, efs_security_group=group)

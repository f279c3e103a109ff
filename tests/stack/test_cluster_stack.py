"""Fine-grained assertions on DLClusterStack: security defaults and the original's behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk.assertions import Match, Template

from constructs_lib.user_data import INSTALL_MODULE
from tests.stack.synth import cluster_template

EFS_LOGICAL_ID = "ClusterSharedStorageFileSystemB0CC6D61"


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template()


def _resources(t: Template, kind: str) -> dict:
    return t.find_resources(kind)


def test_every_launch_template_requires_imdsv2(template: Template) -> None:
    lts = _resources(template, "AWS::EC2::LaunchTemplate")
    assert len(lts) == 2
    for lt in lts.values():
        md = lt["Properties"]["LaunchTemplateData"]["MetadataOptions"]
        assert md["HttpTokens"] == "required"


def test_root_volumes_encrypted_gp3_100gib_by_default(template: Template) -> None:
    for lt in _resources(template, "AWS::EC2::LaunchTemplate").values():
        (bdm,) = lt["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]
        assert bdm["DeviceName"] == "/dev/xvda"  # AL2023 DLAMI root device: resizes root
        assert bdm["Ebs"] == {
            "Encrypted": True,
            "VolumeType": "gp3",
            "VolumeSize": 100,
            "DeleteOnTermination": True,
        }


def test_no_ingress_from_anywhere_by_default(template: Template) -> None:
    text = json.dumps(template.to_json())
    assert "0.0.0.0/0" not in text.replace('"DestinationCidrBlock": "0.0.0.0/0"', "").replace(
        '"CidrIp": "0.0.0.0/0", "Description": "Allow all outbound traffic by default"', ""
    )
    for sg in _resources(template, "AWS::EC2::SecurityGroup").values():
        for rule in sg["Properties"].get("SecurityGroupIngress", []):
            assert rule.get("CidrIp") != "0.0.0.0/0"
    for rule in _resources(template, "AWS::EC2::SecurityGroupIngress").values():
        assert "CidrIp" not in rule["Properties"], rule
    # and no port 22 at all without sshCidr
    assert '"FromPort": 22' not in text


def test_ssh_only_from_ssh_cidr_and_master_public() -> None:
    t = cluster_template(sshCidr="203.0.113.7/32")
    t.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {
            "SecurityGroupIngress": [
                Match.object_like(
                    {"CidrIp": "203.0.113.7/32", "FromPort": 22, "ToPort": 22, "IpProtocol": "tcp"}
                )
            ],
        },
    )
    sgs_with_22 = [
        sg
        for sg in t.find_resources("AWS::EC2::SecurityGroup").values()
        if any(r.get("FromPort") == 22 for r in sg["Properties"].get("SecurityGroupIngress", []))
    ]
    assert len(sgs_with_22) == 1
    lts = t.find_resources("AWS::EC2::LaunchTemplate")
    public = [
        lt for lt in lts.values() if lt["Properties"]["LaunchTemplateData"].get("NetworkInterfaces")
    ]
    assert len(public) == 1  # the master only
    nic = public[0]["Properties"]["LaunchTemplateData"]["NetworkInterfaces"][0]
    assert nic["AssociatePublicIpAddress"] is True and len(nic["Groups"]) == 2


def test_efs_is_encrypted_retained_and_its_logical_id_is_pinned(template: Template) -> None:
    fs = template.find_resources("AWS::EFS::FileSystem")
    assert list(fs) == [EFS_LOGICAL_ID], "renaming the EFS construct would replace your data"
    res = fs[EFS_LOGICAL_ID]
    assert res["DeletionPolicy"] == "Retain" and res["UpdateReplacePolicy"] == "Retain"
    assert res["Properties"]["Encrypted"] is True
    assert res["Properties"]["PerformanceMode"] == "generalPurpose"
    statements = res["Properties"]["FileSystemPolicy"]["Statement"]
    assert any(
        s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        for s in statements
    )
    assert len(template.find_resources("AWS::EFS::MountTarget")) == 2  # one per private subnet


def test_efs_allows_nfs_only_from_cluster_nodes(template: Template) -> None:
    ingress = [
        r["Properties"]
        for r in template.find_resources("AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"].get("FromPort") == 2049
    ]
    assert len(ingress) == 1
    assert ingress[0]["SourceSecurityGroupId"]["Fn::GetAtt"][0].startswith(
        "ClusterNodeSecurityGroup"
    )


def test_existing_file_system_creates_none() -> None:
    t = cluster_template(efsFileSystemId="fs-0123456789abcdef0", vpcId="vpc-0123456789abcdef0",
                         vpcPrivateSubnetIds="subnet-0123456789abcdef0,subnet-0123456789abcdef1",
                         availabilityZones="us-east-1a,us-east-1b")
    t.resource_count_is("AWS::EFS::FileSystem", 0)
    t.resource_count_is("AWS::EFS::MountTarget", 0)
    assert "fs-0123456789abcdef0" in json.dumps(t.find_resources("AWS::EC2::LaunchTemplate"))


def test_queues_and_topic_encrypted_and_tls_only(template: Template) -> None:
    queues = template.find_resources("AWS::SQS::Queue")
    # the master queue, its dead-letter queue and the node-keys queue (workers only send
    # there: constructs_lib/node_keys.py): no worker queue
    assert len(queues) == 3
    assert not [q for q in queues if "Worker" in q]
    for q in queues.values():
        assert q["Properties"]["SqsManagedSseEnabled"] is True
    policies = template.find_resources("AWS::SQS::QueuePolicy")
    assert len(policies) == 3
    for p in policies.values():
        (st,) = [s for s in p["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
        assert st["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    # the Auto Scaling notifications' topic and the alarm topic
    topics = template.find_resources("AWS::SNS::Topic")
    assert len(topics) == 2
    for t in topics.values():
        assert "KmsMasterKeyId" in t["Properties"]
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    policies = template.find_resources("AWS::SNS::TopicPolicy")
    assert len(policies) == 2
    for p in policies.values():
        assert any(s["Effect"] == "Deny"
                   and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
                   for s in p["Properties"]["PolicyDocument"]["Statement"])


def test_groups_notify_all_four_events_and_are_tagged(template: Template) -> None:
    groups = template.find_resources("AWS::AutoScaling::AutoScalingGroup")
    assert len(groups) == 2
    roles = {}
    for lid, g in groups.items():
        (nc,) = g["Properties"]["NotificationConfigurations"]
        assert sorted(nc["NotificationTypes"]) == sorted(
            [
                "autoscaling:EC2_INSTANCE_LAUNCH",
                "autoscaling:EC2_INSTANCE_LAUNCH_ERROR",
                "autoscaling:EC2_INSTANCE_TERMINATE",
                "autoscaling:EC2_INSTANCE_TERMINATE_ERROR",
            ]
        )
        tags = {t["Key"]: t for t in g["Properties"]["Tags"]}
        assert tags["dl-cluster:id"]["Value"] == "DLClusterStack"
        assert tags["NodeType"]["PropagateAtLaunch"] is True
        roles[tags["NodeType"]["Value"]] = (lid, g)
    master_id, master = roles["Master"]
    _, worker = roles["Worker"]
    assert (
        master["Properties"]["MinSize"],
        master["Properties"]["MaxSize"],
        master["Properties"]["DesiredCapacity"],
    ) == ("1", "1", "1")
    assert (
        worker["Properties"]["MinSize"],
        worker["Properties"]["MaxSize"],
        worker["Properties"]["DesiredCapacity"],
    ) == ("1", "2", "2")
    # workers after the master, both after the capacity adjuster's subscription
    assert master_id in worker["DependsOn"]
    assert any(
        (d.startswith("ClusterCapacityAdjusterTopic")
        and "Subscription" in d)
        or d.startswith("ClusterCapacityAdjusterFunctionTopic")
        for d in worker["DependsOn"]
    )
    # one zone by default, both groups in it (docs/capacity.md, "Zones"; placementGroup=false
    # spreads them: tests/stack/test_capacity.py)
    assert master["Properties"]["VPCZoneIdentifier"] == worker["Properties"][
        "VPCZoneIdentifier"]
    assert len(master["Properties"]["VPCZoneIdentifier"]) == 1


def test_worker_count_context_drives_capacity() -> None:
    t = cluster_template(workerCount="5")
    t.has_resource_properties(
        "AWS::AutoScaling::AutoScalingGroup",
        {"DesiredCapacity": "5", "MaxSize": "5", "MinSize": "1"},
    )


def test_wait_condition_55_minutes_after_master(template: Template) -> None:
    ((_, wc),) = template.find_resources("AWS::CloudFormation::WaitCondition").items()
    assert wc["Properties"]["Timeout"] == "3300" and wc["Properties"]["Count"] == 1
    assert any(d.startswith("ClusterMasterGroup") for d in wc["DependsOn"])


def test_lambda_role_limited_to_this_clusters_groups(template: Template) -> None:
    policies = template.find_resources("AWS::IAM::Policy")
    (adjuster,) = [
        p for lid, p in policies.items() if lid.startswith("ClusterCapacityAdjusterRole")
    ]
    statements = {s.get("Sid"): s for s in adjuster["Properties"]["PolicyDocument"]["Statement"]}
    write = statements["AdjustOnlyThisClustersGroups"]
    assert write["Action"] == "autoscaling:SetDesiredCapacity"  # the only write it makes
    assert write["Condition"] == {
        "StringEquals": {"autoscaling:ResourceTag/dl-cluster:id": "DLClusterStack"}
    }
    assert statements["ReadGroups"]["Action"] == "autoscaling:DescribeAutoScalingGroups"
    sends = [
        s
        for s in statements.values()
        if s.get("Action") == "sqs:SendMessage" or "sqs:SendMessage" in s.get("Action", [])
    ]
    assert len(sends) == 1 and "ClusterMetadataQueuesMaster" in json.dumps(sends[0]["Resource"])
    actions = json.dumps([s["Action"] for s in statements.values()])
    assert '*"' not in actions.replace("kms:GenerateDataKey*", "")  # no wildcard actions
    assert "Suspend" not in actions  # never suspends ReplaceUnhealthy (the original's bug)


def test_lambda_matches_its_code() -> None:
    """Handler path, runtime and env vars in the template are what lambda_src implements."""
    import importlib

    from constructs_lib.capacity_adjuster import HANDLER

    t = cluster_template()
    fns = {
        lid: f
        for lid, f in t.find_resources("AWS::Lambda::Function").items()
        if lid.startswith("ClusterCapacityAdjuster")
    }
    (fn,) = fns.values()
    props = fn["Properties"]
    assert props["Handler"] == HANDLER
    assert props["Runtime"] == "python3.14"
    module_name, func_name = HANDLER.split(".")
    module = importlib.import_module(f"lambda_src.{module_name}")
    assert callable(getattr(module, func_name))
    env = props["Environment"]["Variables"]
    assert set(env) == {
        "MASTER_QUEUE_URL",
        "CLUSTER_ID",
        "CLUSTER_TAG_KEY",
        "ROLE_TAG_KEY",
        "LOG_LEVEL",
        "ZONE_CHOICES",
        "MAX_ZONE_MOVES",
        "LAUNCH_RETRY_SECONDS",
        "WAIT_HANDLE_URL",
    }
    assert env["CLUSTER_TAG_KEY"] == "dl-cluster:id" and env["ROLE_TAG_KEY"] == "NodeType"
    source = importlib.util.find_spec(f"lambda_src.{module_name}").origin
    code = Path(source).read_text()
    for var in ("MASTER_QUEUE_URL", "CLUSTER_ID", "CLUSTER_TAG_KEY", "ROLE_TAG_KEY"):
        assert var in code, f"{var} set by the construct but not read by the handler"
    lg = t.find_resources("AWS::Logs::LogGroup")
    assert any(g["Properties"].get("RetentionInDays") == 30 for g in lg.values())


def test_node_roles_read_only_their_asset_and_have_ssm(template: Template) -> None:
    roles = [
        r for lid, r in template.find_resources("AWS::IAM::Role").items() if "InstanceRole" in lid
    ]
    assert len(roles) == 2
    for r in roles:
        assert "AmazonSSMManagedInstanceCore" in json.dumps(r["Properties"]["ManagedPolicyArns"])
    node_policies = [
        p for lid, p in template.find_resources("AWS::IAM::Policy").items() if "InstanceRole" in lid
    ]
    for p in node_policies:
        (s3,) = [
            s
            for s in p["Properties"]["PolicyDocument"]["Statement"]
            if s.get("Sid") == "ReadNodeScripts"
        ]
        assert s3["Action"] == "s3:GetObject"
        assert ".zip" in json.dumps(s3["Resource"])


def test_user_data_starts_the_agent_with_its_settings(template: Template) -> None:
    lts = template.find_resources("AWS::EC2::LaunchTemplate")
    rendered = {}
    for lt in lts.values():
        parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
        text = "".join(p if isinstance(p, str) else "<token>" for p in parts)
        role = "master" if "--role 'master'" in text else "worker"
        rendered[role] = text
    assert set(rendered) == {"master", "worker"}
    for role, text in rendered.items():
        assert text.startswith("#!/bin/bash\n")
        assert f"-m {INSTALL_MODULE} --role" in text
        assert "--worker-queue-url" not in text
        for flag in (
            "--cluster-id 'DLClusterStack'",
            "--master-queue-url '<token>'",
            "--efs-id '<token>'",
            "--mount-point '/efs'",
            "--setup-timeout '3300'",
            "--region '<token>'",
        ):
            assert flag in text, (role, flag)
    assert "--wait-handle '<token>'" in rendered["master"]
    assert "--wait-handle ''" in rendered["worker"]


def test_placement_group_and_custom_ami_and_al2023() -> None:
    t = cluster_template(
        placementGroup="true",
        amiId="ami-0123456789abcdef0",
        imageType="amazon-linux-2023",
        rootVolumeGiB="200",
    )
    t.resource_count_is("AWS::EC2::PlacementGroup", 2)  # one per zone the groups may move to
    t.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["ImageId"] == "ami-0123456789abcdef0"
        assert "Placement" not in data  # on the groups, where a zone move can change it
        (bdm,) = data["BlockDeviceMappings"]
        assert bdm["DeviceName"] == "/dev/xvda" and bdm["Ebs"]["VolumeSize"] == 200
    assert not t.to_json().get("Parameters", {}).keys() - {"BootstrapVersion"}


def test_default_image_from_public_dlami_parameter(template: Template) -> None:
    params = template.to_json()["Parameters"]
    (ami,) = [p for k, p in params.items() if k.startswith("SsmParameterValue")]
    assert ami["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert ami["Default"].startswith("/aws/service/deeplearning/ami/x86_64/")


def test_outputs_for_the_user(template: Template) -> None:
    outputs = template.to_json()["Outputs"]
    for key in (
        "MasterGroupName",
        "WorkerGroupName",
        "FileSystemId",
        "MasterQueueUrl",
        "ConnectCommand",
        "WorkerLaunchTemplateId",
    ):
        assert key in outputs
    assert "WorkerQueueUrl" not in outputs
    assert "aws ssm start-session" in json.dumps(outputs["ConnectCommand"])


def test_vpc_has_flow_logs_nat_and_two_azs(template: Template) -> None:
    template.resource_count_is("AWS::EC2::FlowLog", 1)
    template.resource_count_is("AWS::EC2::NatGateway", 1)
    template.resource_count_is("AWS::EC2::Subnet", 4)
    template.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": "10.0.0.0/16"})


def test_operators_stage_and_the_master_fetches_workdirs_only(template: Template) -> None:
    """dlc submit --workdir's grants: operators put under workdirs/ (no read, list or
    delete), the master gets under workdirs/, both reach the bucket's key through S3 only;
    the bucket is KMS-encrypted with its own key, TLS-only, versioned, public access
    blocked, its access logged, and its archives expire."""
    t = template
    (bucket_id, bucket), = [(k, v) for k, v in t.find_resources("AWS::S3::Bucket").items()
                            if "WorkdirStagingBucket" in k]
    props = bucket["Properties"]
    enc = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert enc["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert "Ref" in str(enc["ServerSideEncryptionByDefault"]["KMSMasterKeyID"]) or \
        "Fn::GetAtt" in str(enc["ServerSideEncryptionByDefault"]["KMSMasterKeyID"])
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert set(props["PublicAccessBlockConfiguration"].values()) == {True}
    assert props["LoggingConfiguration"]["LogFilePrefix"] == "staging/"
    assert props["LifecycleConfiguration"]["Rules"][0]["ExpirationInDays"] == 7
    policies = t.find_resources("AWS::S3::BucketPolicy")
    assert any(p["Properties"]["Bucket"] == {"Ref": bucket_id}
               and "aws:SecureTransport" in str(p) for p in policies.values())
    operator = next(iter(t.find_resources(
        "AWS::IAM::ManagedPolicy", {"Properties": {"Description": Match.string_like_regexp(
            "dlc day-2")}}).values()))
    stmts = {s.get("Sid"): s for s in operator["Properties"]["PolicyDocument"]["Statement"]}
    assert sorted(stmts["StageWorkdirs"]["Action"]) == ["s3:AbortMultipartUpload", "s3:PutObject"]
    assert stmts["StageWorkdirs"]["Resource"]["Fn::Join"][1][-1] == \
        "/workdirs/${aws:PrincipalTag/dl-user}/*"  # each operator under their own user
    admin = next(iter(t.find_resources(
        "AWS::IAM::ManagedPolicy", {"Properties": {"Description": Match.string_like_regexp(
            "root shell")}}).values()))
    admin_stmts = {s.get("Sid"): s for s in admin["Properties"]["PolicyDocument"]["Statement"]}
    assert admin_stmts["StageWorkdirs"]["Resource"]["Fn::Join"][1][-1] == "/workdirs/*"
    assert "s3:GetObject" not in str(admin)
    assert "kms:ViaService" in str(stmts["StageWorkdirsKey"]["Condition"])
    text = str(operator)
    assert "s3:GetObject" not in text and "s3:ListBucket" not in text
    master = [p for k, p in t.find_resources("AWS::IAM::Policy").items()
              if k.startswith("ClusterMasterGroupInstanceRole")]
    actions = [s["Action"] for p in master for s in p["Properties"]["PolicyDocument"]
               ["Statement"] if bucket_id in str(s["Resource"])]
    assert actions == ["s3:GetObject"]

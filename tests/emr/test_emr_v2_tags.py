"""EMR with AmazonEMRServicePolicy_v2 launches only into subnets and security groups tagged
``for-use-with-amazon-emr-managed-policies=true``: every group the cluster names is tagged
(the EFS mount targets' group included), and the emulator refuses an untagged one."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.conftest import REGION

TAG = "for-use-with-amazon-emr-managed-policies"
V2 = "arn:aws:iam::aws:policy/service-role/AmazonEMRServicePolicy_v2"
GROUP_KEYS = ("EmrManagedMasterSecurityGroup", "EmrManagedSlaveSecurityGroup",
              "ServiceAccessSecurityGroup", "AdditionalMasterSecurityGroups",
              "AdditionalSlaveSecurityGroups")


def referenced_groups(value) -> set[str]:
    """Logical ids of the security groups a (list of) GetAtt refers to."""
    if isinstance(value, list):
        return set().union(*(referenced_groups(v) for v in value)) if value else set()
    text = json.dumps(value)
    return {part for part in json.loads(text).get("Fn::GetAtt", [""])[:1]} if isinstance(
        value, dict) else set()


def test_every_security_group_of_the_cluster_carries_the_tag(default_synth):
    resources = default_synth.resources
    _cid, cluster = default_synth.only("AWS::EMR::Cluster")
    instances = cluster["Properties"]["Instances"]
    groups = set().union(*(referenced_groups(instances.get(k, [])) for k in GROUP_KEYS))
    assert len(groups) >= 4, groups  # primary, core, service access, the EFS group
    for logical_id in groups:
        tags = {t["Key"]: t["Value"] for t in
                resources[logical_id]["Properties"].get("Tags", [])}
        assert tags.get(TAG) == "true", f"{logical_id} is not tagged {TAG}=true"


@pytest.fixture()
def network(moto_reset):
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_reset)
    emr = boto3.client("emr", region_name=REGION, endpoint_url=moto_reset)
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    tagged = [{"ResourceType": "subnet", "Tags": [{"Key": TAG, "Value": "true"}]}]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24",
                               TagSpecifications=tagged)["Subnet"]["SubnetId"]

    def group(name: str, tag: bool) -> str:
        spec = [{"ResourceType": "security-group", "Tags": [{"Key": TAG, "Value": "true"}]}]
        return ec2.create_security_group(GroupName=name, Description=name, VpcId=vpc,
                                         **({"TagSpecifications": spec} if tag else {}))[
            "GroupId"]

    trust = json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "elasticmapreduce.amazonaws.com"},
        "Action": "sts:AssumeRole"}]})
    # as the stack creates it: a template role with the managed policy's ARN
    cfn = boto3.client("cloudformation", region_name=REGION, endpoint_url=moto_reset)
    cfn.create_stack(StackName="roles", TemplateBody=json.dumps({"Resources": {
        "V2": {"Type": "AWS::IAM::Role", "Properties": {
            "RoleName": "EmrV2", "AssumeRolePolicyDocument": json.loads(trust),
            "ManagedPolicyArns": [V2]}},
        "V1": {"Type": "AWS::IAM::Role", "Properties": {
            "RoleName": "EmrV1", "AssumeRolePolicyDocument": json.loads(trust)}}}}))
    managed = {k: group(k, True) for k in ("primary", "core", "service")}
    return {"emr": emr, "subnet": subnet, "group": group, "managed": managed}


def run(n, role: str, extra: str):
    g = n["managed"]
    return n["emr"].run_job_flow(
        Name="c", ReleaseLabel="emr-7.0.0", ServiceRole=role, JobFlowRole="EMR_EC2_DefaultRole",
        Instances={"Ec2SubnetId": n["subnet"], "MasterInstanceType": "m5.xlarge",
                   "InstanceCount": 1, "KeepJobFlowAliveWhenNoSteps": True,
                   "EmrManagedMasterSecurityGroup": g["primary"],
                   "EmrManagedSlaveSecurityGroup": g["core"],
                   "ServiceAccessSecurityGroup": g["service"],
                   "AdditionalMasterSecurityGroups": [extra]})


def test_the_emulator_refuses_an_untagged_group_under_the_v2_policy(network):
    efs = network["group"]("efs-untagged", False)
    with pytest.raises(ClientError) as exc:
        run(network, "EmrV2", efs)
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert efs in str(exc.value) and TAG in str(exc.value)
    assert run(network, "EmrV2", network["group"]("efs-tagged", True))["JobFlowId"]
    assert run(network, "EmrV1", efs)["JobFlowId"]  # no v2 policy: no tag needed

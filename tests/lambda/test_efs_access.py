"""``Custom::EfsAccessCheck``: an existing EFS whose mount targets admit no NFS from the
cluster's nodes is refused before any node boots, naming each zone and the command that
fixes it. The decision (``problems``) is pure and tested on its own; ``respond`` reads the
mount targets, their groups and the nodes' subnets with real boto3 against moto."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from lambda_src import custom_resources, efs_access
from lambda_src.efs_access import MountTarget, NodeSubnet, problems

REGION = "us-east-1"
NODES = "sg-0nodes"
SUBNETS = [NodeSubnet("subnet-a", "us-east-1a", "10.0.1.0/24"),
           NodeSubnet("subnet-b", "us-east-1b", "10.0.2.0/24")]


def group(group_id: str, *permissions: dict[str, Any]) -> dict[str, Any]:
    return {"GroupId": group_id, "IpPermissions": list(permissions)}


def nfs_from_group(source: str, protocol: str = "tcp", ports: tuple[int, int] = (2049, 2049)
                   ) -> dict[str, Any]:
    return {"IpProtocol": protocol, "FromPort": ports[0], "ToPort": ports[1],
            "UserIdGroupPairs": [{"GroupId": source}]}


def nfs_from_cidr(cidr: str, ports: tuple[int, int] = (2049, 2049)) -> dict[str, Any]:
    return {"IpProtocol": "tcp", "FromPort": ports[0], "ToPort": ports[1],
            "IpRanges": [{"CidrIp": cidr}]}


def targets(*groups_by_zone: tuple[str, tuple[dict, ...]]) -> list[MountTarget]:
    return [MountTarget(f"fsmt-{zone[-1]}", zone, groups) for zone, groups in groups_by_zone]


@pytest.mark.parametrize("rule", [
    nfs_from_group(NODES),                                  # the stack's access group, attached
    nfs_from_group(NODES, protocol="-1", ports=(-1, -1)),   # all traffic from the nodes
    nfs_from_group(NODES, ports=(0, 65535)),
    nfs_from_cidr("10.0.0.0/16"),                           # the VPC's block
])
def test_a_rule_admitting_the_nodes_in_every_zone_passes(rule: dict[str, Any]) -> None:
    both = targets(("us-east-1a", (group("sg-other"), group("sg-mt", rule))),
                   ("us-east-1b", (group("sg-mt", rule),)))
    assert problems("fs-1", both, NODES, SUBNETS) == []


@pytest.mark.parametrize("rule", [
    nfs_from_group("sg-someone-else"),
    nfs_from_group(NODES, ports=(22, 22)),
    nfs_from_group(NODES, protocol="udp", ports=(2049, 2049)),
    nfs_from_cidr("10.0.1.0/25"),                            # half the nodes' subnet
    nfs_from_cidr("192.168.0.0/16"),
])
def test_a_zone_whose_mount_target_does_not_admit_the_nodes_is_named_with_the_fix(
        rule: dict[str, Any]) -> None:
    ok = nfs_from_cidr("10.0.0.0/16")
    found = problems("fs-1", targets(("us-east-1a", (group("sg-mt", rule),)),
                                     ("us-east-1b", (group("sg-ok", ok),))), NODES, SUBNETS)
    assert found == [
        "us-east-1a: mount target fsmt-a of fs-1 admits no NFS from the nodes (subnet-a, "
        "10.0.1.0/24; security group sg-0nodes): aws ec2 authorize-security-group-ingress "
        "--group-id sg-mt --protocol tcp --port 2049 --cidr 10.0.1.0/24"]


def test_a_zone_without_a_mount_target_is_named_with_the_command_that_makes_one() -> None:
    found = problems("fs-1", targets(("us-east-1a", (group("sg-mt", nfs_from_group(NODES)),))),
                     NODES, SUBNETS)
    assert found == [
        "us-east-1b: fs-1 has no mount target there (the nodes of subnet-b mount the one in "
        "their own zone): aws efs create-mount-target --file-system-id fs-1 --subnet-id "
        "subnet-b --security-groups <a group admitting TCP 2049 from 10.0.2.0/24>"]


@pytest.fixture()
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", REGION)):
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield boto3.client("efs", region_name=REGION), boto3.client("ec2", region_name=REGION)


class Clients:
    def __init__(self, efs: Any, ec2: Any) -> None:
        self.efs, self.ec2 = efs, ec2


def test_respond_reads_the_file_system_as_aws_describes_it(aws: tuple[Any, Any]) -> None:
    efs, ec2 = aws
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24",
                                 AvailabilityZone=zone)["Subnet"]["SubnetId"]
               for i, zone in ((1, "us-east-1a"), (2, "us-east-1b"))]
    nodes = ec2.create_security_group(GroupName="nodes", Description="n",
                                      VpcId=vpc)["GroupId"]
    mt_group = ec2.create_security_group(GroupName="mt", Description="m", VpcId=vpc)["GroupId"]
    fs = efs.create_file_system(CreationToken="t")["FileSystemId"]
    for subnet in subnets:
        efs.create_mount_target(FileSystemId=fs, SubnetId=subnet, SecurityGroups=[mt_group])
    event = {"RequestType": "Create", "ResponseURL": "unused", "RequestId": "r",
             "StackId": f"arn:aws:cloudformation:{REGION}:123456789012:stack/S/1",
             "LogicalResourceId": "EfsAccessCheck", "ResourceType": efs_access.RESOURCE_TYPE,
             "ResourceProperties": {"FileSystemId": fs, "NodeSecurityGroupId": nodes,
                                    "SubnetIds": subnets}}
    refused = custom_resources.respond(event, Clients(efs, ec2))
    assert refused["Status"] == "FAILED"
    assert refused["Reason"].count("admits no NFS from the nodes") == 2, refused["Reason"]
    assert f"--group-id {mt_group} --protocol tcp --port 2049 --cidr 10.0.1.0/24" in \
        refused["Reason"]
    ec2.authorize_security_group_ingress(GroupId=mt_group, IpPermissions=[
        nfs_from_group(nodes)])  # what attaching the stack's MountTargetAccess group gives
    answer = custom_resources.respond(event, Clients(efs, ec2))
    assert answer["Status"] == "SUCCESS", answer
    assert custom_resources.respond({**event, "RequestType": "Delete",
                                     "PhysicalResourceId": "x"}, Clients(None, None))["Status"] == \
        "SUCCESS"

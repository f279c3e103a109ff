"""An existing EFS (``efsFileSystemId``) is checked before the nodes launch: a
``Custom::EfsAccessCheck`` names the file system, the nodes' security group and every subnet
the nodes may use, both groups depend on it, and its function may read only that file
system's mount targets (the decision: tests/lambda/test_efs_access.py). A new file system
needs no check (the stack makes its mount targets and their rule)."""

from __future__ import annotations

import json

from tests.stack.synth import cluster_template

EXISTING = {"efsFileSystemId": "fs-0123456789abcdef0", "vpcId": "vpc-0123456789abcdef0",
            "vpcPrivateSubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
            "availabilityZones": "us-east-1a,us-east-1b"}


def _depends(resource: dict) -> set[str]:
    depends = resource.get("DependsOn") or []
    return {depends} if isinstance(depends, str) else set(depends)


def test_an_existing_file_system_is_checked_before_the_groups_launch() -> None:
    t = cluster_template(**EXISTING).to_json()["Resources"]
    (check_id,) = [k for k, v in t.items() if v["Type"] == "Custom::EfsAccessCheck"]
    props = t[check_id]["Properties"]
    assert props["FileSystemId"] == "fs-0123456789abcdef0"
    assert props["NodeSecurityGroupId"]["Fn::GetAtt"][0].startswith("ClusterNodeSecurityGroup")
    assert props["SubnetIds"] == ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
    (adjuster,) = [k for k, v in t.items() if v["Type"] == "AWS::Lambda::Function"
                   and v["Properties"].get("Handler") == "capacity_adjuster.handler"]
    assert props["ServiceToken"] == {"Fn::GetAtt": [adjuster, "Arn"]}
    groups = [k for k, v in t.items() if v["Type"] == "AWS::AutoScaling::AutoScalingGroup"]
    assert len(groups) == 2 and all(check_id in _depends(t[g]) for g in groups)
    (policy_id,) = [k for k, v in t.items() if v["Type"] == "AWS::IAM::Policy"
                    and "ReadTheExistingFileSystemsMountTargets" in json.dumps(v["Properties"])]
    assert policy_id in _depends(t[check_id])
    statements = {s.get("Sid"): s for s in
                  t[policy_id]["Properties"]["PolicyDocument"]["Statement"]}
    reads = statements["ReadTheExistingFileSystemsMountTargets"]
    assert sorted(reads["Action"]) == ["elasticfilesystem:DescribeMountTargetSecurityGroups",
                                       "elasticfilesystem:DescribeMountTargets"]
    assert "file-system/fs-0123456789abcdef0" in json.dumps(reads["Resource"])
    rules = statements["ReadTheMountTargetsRules"]
    assert (sorted(rules["Action"]), rules["Resource"]) == (
        ["ec2:DescribeSecurityGroups", "ec2:DescribeSubnets"], "*")


def test_a_new_file_system_has_no_check() -> None:
    assert not cluster_template().find_resources("Custom::EfsAccessCheck")

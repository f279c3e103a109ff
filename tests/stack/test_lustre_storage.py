"""``sharedStorage=fsx-lustre`` (constructs_lib/lustre_storage.py): an FSx for Lustre
PERSISTENT_2 file system beside EFS, KMS-encrypted, reachable on Lustre's ports from the node
groups only, linked to the data bucket, and mounted by every node's user data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template

from constructs_lib.lustre_storage import LustreStorage
from constructs_lib.validation import ConfigError
from tests.stack.checkov_skips import SKIPS, checkov_binary, failed_checks
from tests.stack.synth import cluster_template


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template(sharedStorage="fsx-lustre", dataBucket="my-datasets",
                            dataPrefix="imagenet/")


def only(template: Template, kind: str) -> tuple[str, dict]:
    (item,) = template.find_resources(kind).items()
    return item


def test_off_by_default() -> None:
    plain = cluster_template()
    assert not plain.find_resources("AWS::FSx::FileSystem")
    assert "lustre" not in json.dumps(plain.find_resources("AWS::EC2::LaunchTemplate"))


def test_a_persistent_2_file_system_encrypted_with_its_own_rotating_key(template) -> None:
    _, fs = only(template, "AWS::FSx::FileSystem")
    props = fs["Properties"]
    assert props["FileSystemType"] == "LUSTRE" and props["StorageCapacity"] == 1200
    assert props["FileSystemTypeVersion"] == "2.15"  # new file systems: the newest Lustre
    assert props["LustreConfiguration"] == {"DeploymentType": "PERSISTENT_2",
                                            "PerUnitStorageThroughput": 250,
                                            "DataCompressionType": "LZ4"}
    key_id = props["KmsKeyId"]["Ref"]
    key = template.to_json()["Resources"][key_id]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True
    (subnet,) = props["SubnetIds"]
    assert "private" in subnet["Ref"]  # the nodes' first private subnet, not a public one


def test_only_the_nodes_and_the_file_system_itself_reach_lustres_ports(template) -> None:
    tpl = template.to_json()["Resources"]
    _, fs = only(template, "AWS::FSx::FileSystem")
    (group,) = [g["Fn::GetAtt"][0] for g in fs["Properties"]["SecurityGroupIds"]]
    ingress = sorted((r["Properties"]["SourceSecurityGroupId"]["Fn::GetAtt"][0],
                      r["Properties"]["FromPort"], r["Properties"]["ToPort"])
                     for r in tpl.values() if r["Type"] == "AWS::EC2::SecurityGroupIngress"
                     and r["Properties"]["GroupId"] == {"Fn::GetAtt": [group, "GroupId"]})
    nodes = next(k for k in tpl if k.startswith("ClusterNodeSecurityGroup")
                 and tpl[k]["Type"] == "AWS::EC2::SecurityGroup")
    assert ingress == sorted([(nodes, 988, 988), (nodes, 1018, 1023),
                              (group, 988, 988), (group, 1018, 1023)])
    assert "SecurityGroupIngress" not in tpl[group]["Properties"]  # no inline (CIDR) rules
    # both ways: Lustre's servers open connections to the clients too (AWS's client rules)
    to_nodes = sorted((r["Properties"]["SourceSecurityGroupId"]["Fn::GetAtt"][0],
                       r["Properties"]["FromPort"], r["Properties"]["ToPort"])
                      for r in tpl.values() if r["Type"] == "AWS::EC2::SecurityGroupIngress"
                      and r["Properties"]["GroupId"] == {"Fn::GetAtt": [nodes, "GroupId"]}
                      and "SourceSecurityGroupId" in r["Properties"]
                      and r["Properties"]["SourceSecurityGroupId"]["Fn::GetAtt"][0] == group)
    assert to_nodes == [(group, 988, 988), (group, 1018, 1023)]
    egress = sorted((r["Properties"]["DestinationSecurityGroupId"]["Fn::GetAtt"][0],
                     r["Properties"]["FromPort"], r["Properties"]["ToPort"])
                    for r in tpl.values() if r["Type"] == "AWS::EC2::SecurityGroupEgress"
                    and r["Properties"]["GroupId"] == {"Fn::GetAtt": [group, "GroupId"]})
    assert egress == sorted([(nodes, 988, 988), (nodes, 1018, 1023),
                             (group, 988, 988), (group, 1018, 1023)])
    assert not [e for e in tpl[group]["Properties"].get("SecurityGroupEgress", [])
                if e.get("CidrIp") == "0.0.0.0/0"]


def test_the_data_bucket_prefix_is_linked_import_only(template) -> None:
    _, dra = only(template, "AWS::FSx::DataRepositoryAssociation")
    props = dra["Properties"]
    assert props["DataRepositoryPath"] == "s3://my-datasets/imagenet/"
    assert props["FileSystemPath"] == "/data" and props["BatchImportMetaDataOnCreate"] is True
    assert props["S3"] == {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}
    assert "AutoExportPolicy" not in json.dumps(props)  # the cluster never writes the dataset
    assert not cluster_template(sharedStorage="fsx-lustre").find_resources(
        "AWS::FSx::DataRepositoryAssociation")


def test_every_node_installs_the_client_and_mounts_it(template) -> None:
    for _, lt in template.find_resources("AWS::EC2::LaunchTemplate").items():
        body = json.dumps(lt)
        assert "retry sh -c 'dnf install -y -q lustre-client' && mkdir -p '/fsx' && retry " \
               "mount -t lustre -o relatime,flock '" in body
        assert "@tcp:/" in body and "LustreMountName" in body


@pytest.mark.parametrize("props, key", [
    ({"storage_capacity_gib": 2000}, "storage_capacity_gib"),
    ({"storage_capacity_gib": 1000}, "storage_capacity_gib"),
    ({"throughput_per_tib": 200}, "throughput_per_tib"),
    ({"mount_point": "/etc/fsx"}, "mount_point"),
    ({"lustre_version": "2.10"}, "lustre_version"),
])
def test_bad_props_are_refused_naming_them(props, key) -> None:
    stack = Stack(App(), "S")
    vpc = ec2.Vpc(stack, "Vpc")
    with pytest.raises(ConfigError, match=key):
        LustreStorage(stack, "Lustre", vpc=vpc, subnet=vpc.private_subnets[0], **props)


def test_a_bad_setting_is_refused() -> None:
    with pytest.raises(Exception, match="sharedStorage"):
        cluster_template(sharedStorage="nfs")
    with pytest.raises(Exception, match="efs_mount_point /fsx is where FSx for Lustre mounts"):
        cluster_template(sharedStorage="fsx-lustre", efsMountPoint="/fsx")


@pytest.mark.skipif(checkov_binary() is None, reason="checkov is not installed: make "
                    "checkov-setup (its own venv, .venv-checkov)")
def test_checkov_finds_nothing_without_its_reason(template, tmp_path: Path) -> None:
    failures = failed_checks(template.to_json(), tmp_path)
    left = [f"{check} {resource}" for check, resource in failures
            if not any(s.covers(check, resource) for s in SKIPS)]
    assert not left, "checkov findings without a skip:\n" + "\n".join(left)

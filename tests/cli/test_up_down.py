"""``dlc up`` / ``dlc down`` against moto's server with the real CDK CLI: the stack's events
as progress, the nodes as Auto Scaling sees them, the membership wait that says why it
cannot form (no node boots here: no SSM Agent answers), and the file system kept by default
and deleted with ``--delete-data``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest

from dlc import aws, deploy
from dlc.cli import main
from dlc.errors import DlcError
from dlc.remote import choose_document
from dlc.target import resolve
from emulator import deploy as dp
from emulator.address_space import vpc_cidr

pytestmark = pytest.mark.slow


@pytest.fixture()
def emulated_account(moto_reset: str, tmp_path: Path, monkeypatch) -> tuple[str, Path, str]:
    """A clean moto account, CDK-bootstrapped; dlc's cache in the test's temp dir."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dp.bootstrap(dp.cli_env(moto_reset), tmp_path / "cdk.log", tmp_path / "cdk.out")
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"endpoint": moto_reset, "aws": {
        "endpoint": moto_reset, "region": "us-east-1", "access_key_id": "testing",
        "secret_access_key": "testing", "session_token": "testing"}}))
    # A new account has no G-instance vCPUs (emulator/service_quotas.py); the operator's
    # increase for the three g5.xlarge nodes, which dlc up's preflight checks.
    boto3.client("service-quotas", endpoint_url=moto_reset, region_name="us-east-1") \
        .request_service_quota_increase(ServiceCode="ec2", QuotaCode="L-DB2E81BA",
                                        DesiredValue=12)
    ec2 = boto3.client("ec2", endpoint_url=moto_reset, region_name="us-east-1")
    return moto_reset, state, dp.pick_ami(ec2)


def up_args(state: Path, ami: str) -> list[str]:
    return ["--emulator", str(state), "up", "--no-wait", "-c", f"vpcCidr={vpc_cidr()}",
            "-c", f"amiId={ami}", "-c", "workerCount=1", "-c", "clusterUsers=alice"]


def file_systems(endpoint: str) -> set[str]:
    efs = boto3.client("efs", endpoint_url=endpoint, region_name="us-east-1")
    return {f["FileSystemId"] for f in efs.describe_file_systems()["FileSystems"]}


def buckets(endpoint: str) -> set[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return {b["Name"] for b in s3.list_buckets()["Buckets"]}


def running_instances(endpoint: str) -> set[str]:
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
    return {i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
            for i in r["Instances"] if i["State"]["Name"] not in ("terminated", "shutting-down")}


def test_up_shows_progress_and_down_keeps_or_deletes_the_data(emulated_account, capsys):
    endpoint, state, ami = emulated_account
    assert main(up_args(state, ami)) == 0
    out = capsys.readouterr().out
    assert "deploying DLClusterStack to us-east-1 with the CDK CLI (new stack)" in out
    for line in ("AWS::EC2::VPC", "AWS::EFS::FileSystem", "AWS::AutoScaling::AutoScalingGroup",
                 "AWS::IAM::ManagedPolicy"):
        assert any(line in x and "CREATE_COMPLETE" in x for x in out.splitlines()), line
    assert "stack DLClusterStack: CREATE_COMPLETE" in out
    assert "OperatorPolicyArn: arn:aws:iam::123456789012:policy/" in out

    target = resolve(emulator=str(state), environ={})
    stack = aws.describe_stack(target)
    # clusterUsers: a document of alice's own, by the name the operator policy allows, which
    # dlc finds in the stack and sends for alice (the any-user one for anyone else)
    documents = aws.operator_documents(target)
    assert "dl-op.DLClusterStack.alice" in documents and len(documents) == 2
    assert choose_document(documents, "alice") == "dl-op.DLClusterStack.alice"
    assert choose_document(documents, "bob") != "dl-op.DLClusterStack.alice"
    lines: list[str] = []
    nodes = deploy.wait_nodes(target, stack, lines.append, time.monotonic() + 60)
    assert {n["role"] for n in nodes} == {"master", "worker"}
    assert lines[-1].startswith("nodes: 2/2 InService")
    # No node boots in this test, so no SSM Agent answers: the wait says so and gives up.
    with pytest.raises(DlcError, match="membership did not form") as exc:
        deploy.wait_membership(target, stack, lines.append, time.monotonic() + 2)
    assert "master not answering yet" in str(exc.value) and "InvalidInstanceId" in str(exc.value)

    first_fs = stack.outputs["FileSystemId"]
    first_bucket = stack.outputs["CheckpointBucketName"]
    # what the master agent does at formation: the master and the base worker protected
    # from scale-in; CloudFormation never force-deletes a group, the stack's release lifts it
    asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name="us-east-1")
    for group in asg.describe_auto_scaling_groups()["AutoScalingGroups"]:
        asg.set_instance_protection(
            AutoScalingGroupName=group["AutoScalingGroupName"], ProtectedFromScaleIn=True,
            InstanceIds=[i["InstanceId"] for i in group["Instances"]])
    assert main(["--emulator", str(state), "down"]) == 0
    assert running_instances(endpoint) == set(), "dlc down leaves no instance running"
    out = capsys.readouterr().out
    assert f"kept checkpoint bucket {first_bucket}" in out
    assert first_bucket in buckets(endpoint), "checkpoints must outlive the stack by default"
    assert "destroying DLClusterStack" in out and "stack DLClusterStack deleted" in out
    assert f"kept EFS {first_fs}" in out
    assert any("DELETE_SKIPPED" in x and "AWS::EFS::FileSystem" in x
               for x in out.splitlines()), out
    assert first_fs in file_systems(endpoint), "the data must outlive the stack by default"
    assert main(["--emulator", str(state), "status"]) == 3
    assert "stack DLClusterStack not found in us-east-1" in capsys.readouterr().err

    assert main(up_args(state, ami)) == 0
    second_fs = aws.describe_stack(target).outputs["FileSystemId"]
    second_bucket = aws.describe_stack(target).outputs["CheckpointBucketName"]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for body in (b"step 1", b"step 2"):  # two versions of one checkpoint
        s3.put_object(Bucket=second_bucket, Key="checkpoints/DLClusterStack/c.pt", Body=body)
    capsys.readouterr()
    assert main(["--emulator", str(state), "down", "--delete-data"]) == 0
    out = capsys.readouterr().out
    assert f"deleted EFS {second_fs} (--delete-data)" in out
    assert second_fs not in file_systems(endpoint)
    assert first_fs in file_systems(endpoint), "--delete-data deletes this stack's EFS only"
    assert f"deleted checkpoint bucket {second_bucket} (2 object version(s)" in out
    assert second_bucket not in buckets(endpoint)
    assert first_bucket in buckets(endpoint), "--delete-data deletes this stack's bucket only"

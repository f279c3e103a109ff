"""Data and checkpoints in S3 (constructs_lib/training_data.py): the checkpoint bucket's
protections, the S3 gateway endpoint, and exactly the S3 permissions the nodes get."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match, Template

from constructs_lib.validation import ConfigError
from tests.stack.synth import cluster_template
from tests.support.iam_statements import s3_statements


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template(dataBucket="my-datasets", dataPrefix="digits")


@pytest.fixture(scope="module")
def plain() -> Template:
    return cluster_template()


def checkpoint_bucket(t: Template) -> tuple[str, dict]:
    (found,) = [(k, v) for k, v in t.find_resources("AWS::S3::Bucket").items()
                if "CheckpointBucket" in k]
    return found


def test_the_checkpoint_bucket_is_versioned_kms_encrypted_private_tls_only_and_retained(
        plain: Template) -> None:
    name, bucket = checkpoint_bucket(plain)
    props = bucket["Properties"]
    assert bucket["DeletionPolicy"] == "Retain" and bucket["UpdateReplacePolicy"] == "Retain"
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    key_id = rule["ServerSideEncryptionByDefault"]["KMSMasterKeyID"]["Fn::GetAtt"][0]
    key = plain.to_json()["Resources"][key_id]
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == "Retain", "a deleted key would make the bucket unreadable"
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True}
    assert "LoggingConfiguration" in props
    policies = [p for p in plain.find_resources("AWS::S3::BucketPolicy").values()
                if p["Properties"]["Bucket"] == {"Ref": name}]
    (policy,) = policies
    deny = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
            if s["Effect"] == "Deny"]
    assert deny and deny[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_s3_traffic_goes_through_a_gateway_endpoint_not_the_nat(plain: Template) -> None:
    (endpoint,) = plain.find_resources("AWS::EC2::VPCEndpoint").values()
    props = endpoint["Properties"]
    assert props["VpcEndpointType"] == "Gateway"
    assert "s3" in json.dumps(props["ServiceName"])
    private_tables = [k for k in plain.find_resources("AWS::EC2::RouteTable")
                      if "private" in k.lower()]
    routed = {r["Ref"] for r in props["RouteTableIds"]}
    assert private_tables and set(private_tables) <= routed




def test_jobs_read_the_data_prefix_and_write_their_users_checkpoint_prefix_only(
        template: Template) -> None:
    """The grants are the job role's (jobs get its credentials): the data prefix to read,
    and under this cluster's checkpoint prefix only the session's own user's part."""
    by_sid = {s["Sid"]: s for s in s3_statements(template, "JobRole")}
    assert by_sid["ReadTrainingData"]["Action"] == ["s3:GetObject"]
    assert by_sid["ReadTrainingData"]["Resource"].endswith(':s3:::my-datasets/digits/*"]]}')
    assert by_sid["ReadTrainingDataList"]["Action"] == ["s3:ListBucket"]
    assert by_sid["ReadTrainingDataList"]["Condition"] == {
        "StringLike": {"s3:prefix": ["digits/*"]}}
    assert by_sid["ReadWriteCheckpoints"]["Action"] == [
        "s3:AbortMultipartUpload", "s3:GetObject", "s3:PutObject"]
    assert '"/checkpoints/DLClusterStack/${aws:PrincipalTag/dl-user}/*"' in \
        by_sid["ReadWriteCheckpoints"]["Resource"]
    assert by_sid["ReadWriteCheckpointsList"]["Condition"] == {
        "StringLike": {"s3:prefix": ["checkpoints/DLClusterStack/${aws:PrincipalTag/dl-user}/*"]}}
    (kms,) = [s for s in by_sid.values() if s["Sid"] is None]
    assert kms["Action"] == ["kms:Decrypt", "kms:GenerateDataKey"]
    assert "CheckpointKey" in kms["Resource"]
    assert len(by_sid) == 5, sorted(map(str, by_sid))  # nothing more
    every = [a for s in by_sid.values() for a in s["Action"]]
    assert not [a for a in every if "*" in a or a in ("s3:DeleteObject", "s3:PutBucketPolicy")]


@pytest.mark.parametrize("role", ["MasterGroup", "WorkerGroup"])
def test_the_node_roles_get_neither_data_nor_checkpoints(template: Template, role: str) -> None:
    sids = {s["Sid"] for s in s3_statements(template, role)}
    assert not sids & {"ReadTrainingData", "ReadTrainingDataList", "ReadWriteCheckpoints",
                       "ReadWriteCheckpointsList"}, sids


def test_without_a_data_bucket_jobs_get_no_data_permission(plain: Template) -> None:
    sids = {s["Sid"] for s in s3_statements(plain, "JobRole")}
    assert "ReadTrainingData" not in sids and "ReadWriteCheckpoints" in sids


def test_outputs_name_both_buckets(template: Template, plain: Template) -> None:
    outputs = template.to_json()["Outputs"]
    assert outputs["DataBucketName"]["Value"] == "my-datasets"
    assert outputs["CheckpointBucketName"]["Value"] == {
        "Ref": checkpoint_bucket(template)[0]}
    assert "DataBucketName" not in plain.to_json()["Outputs"]
    template.has_output("CheckpointBucketName", {"Description": Match.string_like_regexp(
        "dlc down keeps it unless --delete-data")})


def test_a_data_prefix_without_a_bucket_names_the_prop() -> None:
    import aws_cdk as cdk

    from constructs_lib.training_data import TrainingData
    from tests.stack.synth import new_app

    with pytest.raises(ConfigError, match="data_prefix"):
        TrainingData(cdk.Stack(new_app(), "S"), "Data", cluster_id="c", data_prefix="x")


def test_only_the_masters_controller_learns_the_checkpoint_prefix(plain: Template) -> None:
    """The master's user data gives its job controller ``--checkpoint-url`` (managed jobs'
    checkpoints are mirrored under it); the workers' do not carry it."""
    name, _ = checkpoint_bucket(plain)
    templates = plain.find_resources("AWS::EC2::LaunchTemplate")
    text = {k: json.dumps(v) for k, v in templates.items()}
    master = [t for k, t in text.items() if "Master" in k]
    workers = [t for k, t in text.items() if "Worker" in k]
    assert master and workers, sorted(text)
    assert all("--checkpoint-url 's3://" in t and json.dumps({"Ref": name}) in t
               and "/checkpoints/DLClusterStack/'" in t for t in master)
    assert not any("--checkpoint-url" in t for t in workers)

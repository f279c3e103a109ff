"""The emulated metadata endpoint hands a node its instance role's credentials, as EC2 does
for an instance profile (emulator/imds.py, ``InstanceRole``): the SDK's own IMDS fetcher
finds them, and AWS sees the node as the role's session named after the instance."""

from __future__ import annotations

import json

import boto3
from botocore.utils import InstanceMetadataFetcher

from emulator.imds import InstanceRole, MetadataServer

TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}


def test_the_node_gets_its_role_credentials(moto_reset, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")  # the fetcher honours it
    iam = boto3.client("iam")
    role = iam.create_role(RoleName="WorkerRole", AssumeRolePolicyDocument=json.dumps(TRUST))
    profile = iam.create_instance_profile(InstanceProfileName="WorkerProfile")
    iam.add_role_to_instance_profile(InstanceProfileName="WorkerProfile", RoleName="WorkerRole")
    arn = profile["InstanceProfile"]["Arn"]
    with MetadataServer() as server:
        url = server.start("127.0.0.1", 0, {"instance_id": "i-0123456789abcdef0",
                                            "address": "127.0.0.1"},
                           InstanceRole(role["Role"]["Arn"], arn, "i-0123456789abcdef0",
                                        "us-east-1"))
        creds = InstanceMetadataFetcher(base_url=url.rstrip("/"), timeout=5,
                                        num_attempts=2).retrieve_iam_role_credentials()
        assert creds["role_name"] == "WorkerRole"
        assert creds["access_key"] != "testing" and creds["token"]
        who = boto3.client("sts", aws_access_key_id=creds["access_key"],
                           aws_secret_access_key=creds["secret_key"],
                           aws_session_token=creds["token"]).get_caller_identity()
        assert who["Arn"] == ("arn:aws:sts::123456789012:assumed-role/WorkerRole/"
                              "i-0123456789abcdef0")


def test_sqs_names_the_instance_that_sent_a_message(moto_reset, monkeypatch) -> None:
    """SenderId is ``<role id>:<instance id>`` for a message the node sent with its role's
    credentials, whatever the body says (emulator/moto_sqs_sender.py)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
    iam = boto3.client("iam")
    role = iam.create_role(RoleName="WorkerRole", AssumeRolePolicyDocument=json.dumps(TRUST))
    profile = iam.create_instance_profile(InstanceProfileName="WorkerProfile")
    iam.add_role_to_instance_profile(InstanceProfileName="WorkerProfile", RoleName="WorkerRole")
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="warm-ready")["QueueUrl"]
    with MetadataServer() as server:
        imds = server.start("127.0.0.1", 0, {"instance_id": "i-0123456789abcdef0",
                                             "address": "127.0.0.1"},
                            InstanceRole(role["Role"]["Arn"],
                                         profile["InstanceProfile"]["Arn"],
                                         "i-0123456789abcdef0", "us-east-1"))
        creds = InstanceMetadataFetcher(base_url=imds.rstrip("/"), timeout=5,
                                        num_attempts=2).retrieve_iam_role_credentials()
    node = boto3.client("sqs", aws_access_key_id=creds["access_key"],
                        aws_secret_access_key=creds["secret_key"],
                        aws_session_token=creds["token"])
    node.send_message(QueueUrl=url, MessageBody='{"instance": "i-0fffffffffffffff0"}')
    node.send_message_batch(QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "b"}])
    got = []
    for _ in range(3):
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                   MessageSystemAttributeNames=["SenderId"]).get("Messages", [])
    assert len(got) == 2
    assert {m["Attributes"]["SenderId"] for m in got} == {
        f"{role['Role']['RoleId']}:i-0123456789abcdef0"}


def test_without_an_instance_profile_there_are_no_credentials(monkeypatch) -> None:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
    with MetadataServer() as server:
        url = server.start("127.0.0.1", 0, {"instance_id": "i-1", "address": "127.0.0.1"})
        assert InstanceMetadataFetcher(base_url=url.rstrip("/"), timeout=2,
                                       num_attempts=1).retrieve_iam_role_credentials() == {}

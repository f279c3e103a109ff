"""moto's IAM authorization as the emulator turns it on (``emulator/iam_enforcement.py``):
the stack's kinds of grant (a queue, a KMS key, an Auto Scaling group, an S3 prefix, a prefix
with the session's ``dl-user`` tag in it, a role trusted by role ARN) are allowed exactly as
far as AWS allows them, and what moto still does not evaluate (conditions) is pinned so
docs/emulator.md stays true."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator import iam_enforcement as ie

ACCOUNT = "123456789012"
EC2_TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "ec2.amazonaws.com"}}]}


def test_resources_match_as_iam_globs_with_policy_variables() -> None:
    tag = {"aws:PrincipalTag/dl-user": "alice"}
    assert ie.glob_match("arn:aws:s3:::b/u/${aws:PrincipalTag/dl-user}/*",
                         "arn:aws:s3:::b/u/alice/x", tag)
    assert not ie.glob_match("arn:aws:s3:::b/u/${aws:PrincipalTag/dl-user}/*",
                             "arn:aws:s3:::b/u/bob/x", tag)
    # no value for the variable: the statement matches nothing (not the literal text)
    assert not ie.glob_match("arn:aws:s3:::b/u/${aws:PrincipalTag/dl-user}/*",
                             "arn:aws:s3:::b/u/${aws:PrincipalTag/dl-user}/x", {})
    assert ie.glob_match("a?c", "abc", {}) and not ie.glob_match("a.c", "abc", {})
    assert ie.glob_match("doc/x${*}", "doc/x*", {}) and not ie.glob_match("doc/x${*}", "doc/xy", {})


def test_a_role_arn_principal_names_its_sessions_and_service_principals_only_aws() -> None:
    role = {"AWS": [f"arn:aws:iam::{ACCOUNT}:role/node"]}
    assert ie.principal_matches(role, f"arn:aws:sts::{ACCOUNT}:assumed-role/node/i-1", ACCOUNT)
    assert not ie.principal_matches(role, f"arn:aws:sts::{ACCOUNT}:assumed-role/other/i-1",
                                    ACCOUNT)
    assert ie.principal_matches({"AWS": ACCOUNT}, f"arn:aws:iam::{ACCOUNT}:user/u", ACCOUNT)
    service = {"Service": "ec2.amazonaws.com"}
    assert ie.principal_matches(
        service, f"arn:aws:sts::{ACCOUNT}:assumed-role/{ie.ADMIN_ROLE}/emulator", ACCOUNT)
    assert not ie.principal_matches(service, f"arn:aws:sts::{ACCOUNT}:assumed-role/node/i-1",
                                    ACCOUNT)


@pytest.fixture()
def enforced(moto_reset: str) -> Iterator[str]:
    try:
        yield moto_reset
    finally:
        ie.disable()


def client(endpoint: str, service: str, creds: dict | None = None):
    c = creds or {"AccessKeyId": "testing", "SecretAccessKey": "testing",
                  "SessionToken": "testing"}
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=c["AccessKeyId"],
                        aws_secret_access_key=c["SecretAccessKey"],
                        aws_session_token=c["SessionToken"])


def denied(call) -> str:
    with pytest.raises(ClientError) as exc:
        call()
    code = exc.value.response["Error"]["Code"]
    assert code in ("AccessDenied", "403"), exc.value
    return str(exc.value)


def test_roles_are_held_to_their_policies_as_aws_holds_them(enforced: str) -> None:
    ep = enforced
    iam, sqs, kms, s3 = (client(ep, s) for s in ("iam", "sqs", "kms", "s3"))
    mine = sqs.create_queue(QueueName="master")["QueueUrl"]
    other = sqs.create_queue(QueueName="other")["QueueUrl"]
    mine_arn = sqs.get_queue_attributes(QueueUrl=mine, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    key = kms.create_key(KeyUsage="SIGN_VERIFY", KeySpec="ECC_NIST_P256")["KeyMetadata"]["Arn"]
    other_key = kms.create_key()["KeyMetadata"]["Arn"]
    s3.create_bucket(Bucket="data")
    for k in ("ok/a", "no/a", "u/alice/a", "u/bob/a"):
        s3.put_object(Bucket="data", Key=k, Body=b"1")
    node = iam.create_role(RoleName="node", AssumeRolePolicyDocument=json.dumps(EC2_TRUST))[
        "Role"]["Arn"]
    iam.create_role(RoleName="other", AssumeRolePolicyDocument=json.dumps(EC2_TRUST))
    iam.put_role_policy(RoleName="node", PolicyName="p", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["sqs:ReceiveMessage", "sqs:GetQueueUrl"],
             "Resource": mine_arn},
            {"Effect": "Allow", "Action": ["kms:Sign", "kms:GetPublicKey"], "Resource": key},
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::data/ok/*"},
            {"Effect": "Allow", "Action": ["sts:AssumeRole", "sts:TagSession"],
             "Resource": "*"}]}))
    job = iam.create_role(RoleName="job", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": ["sts:AssumeRole", "sts:TagSession"],
            "Principal": {"AWS": [node]}}]}))["Role"]["Arn"]
    iam.put_role_policy(RoleName="job", PolicyName="p", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": "s3:GetObject",
            "Resource": "arn:aws:s3:::data/u/${aws:PrincipalTag/dl-user}/*"}]}))

    ie.enable(ACCOUNT)
    # EC2 (the emulator's admin session) hands the node its role's credentials
    creds = client(ep, "sts").assume_role(RoleArn=node, RoleSessionName="i-1")["Credentials"]
    n_sqs, n_kms, n_s3 = (client(ep, s, creds) for s in ("sqs", "kms", "s3"))
    n_sqs.receive_message(QueueUrl=mine)
    denied(lambda: n_sqs.receive_message(QueueUrl=other))
    n_sqs.get_queue_url(QueueName="master")  # by name: the queue it names, as on AWS
    denied(lambda: n_sqs.get_queue_url(QueueName="other"))
    n_kms.sign(KeyId=key, Message=b"x", SigningAlgorithm="ECDSA_SHA_256")
    denied(lambda: n_kms.encrypt(KeyId=other_key, Plaintext=b"x"))
    n_kms.get_public_key(KeyId=key)  # every node's one call for the membership key
    denied(lambda: n_kms.get_public_key(KeyId=other_key))
    n_s3.get_object(Bucket="data", Key="ok/a")
    denied(lambda: n_s3.get_object(Bucket="data", Key="no/a"))
    # a role trusted to EC2 only is not the node's to assume
    denied(lambda: client(ep, "sts", creds).assume_role(
        RoleArn=f"arn:aws:iam::{ACCOUNT}:role/other", RoleSessionName="xx"))
    # the job role trusts the node role: its sessions may assume it, with a dl-user tag
    job_creds = client(ep, "sts", creds).assume_role(
        RoleArn=job, RoleSessionName="alice-j1",
        Tags=[{"Key": "dl-user", "Value": "alice"}])["Credentials"]
    j_s3 = client(ep, "s3", job_creds)
    j_s3.get_object(Bucket="data", Key="u/alice/a")
    denied(lambda: j_s3.get_object(Bucket="data", Key="u/bob/a"))
    # keys moto never issued are refused
    with pytest.raises(ClientError, match=r"InvalidClientTokenId|security token"):
        client(ep, "sqs", {"AccessKeyId": "ASIAXXXX", "SecretAccessKey": "x",
                           "SessionToken": "y"}).list_queues()


def test_moto_does_not_evaluate_conditions_and_a_users_tags_are_its_variables(
        enforced: str) -> None:
    """A statement's ``Condition`` is taken as met (moto evaluates none but a trust policy's
    ``sts:ExternalId``): the Auto Scaling tag condition of the stack's grants does not
    narrow them here. docs/emulator.md says so; this pins it."""
    iam = client(enforced, "iam")
    iam.create_user(UserName="u", Tags=[{"Key": "dl-user", "Value": "u"}])
    iam.put_user_policy(UserName="u", PolicyName="p", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": "autoscaling:DescribeAutoScalingGroups",
            "Resource": "*", "Condition": {"StringEquals": {"aws:PrincipalTag/team": "x"}}}]}))
    key = iam.create_access_key(UserName="u")["AccessKey"]
    ie.enable(ACCOUNT)
    asg = client(enforced, "autoscaling", {**key, "SessionToken": ""})
    asg.describe_auto_scaling_groups()  # on AWS: AccessDenied (the user has no tag "team")
    # a user's own tags are its ${aws:PrincipalTag/...} (allowed under u/, refused elsewhere)
    iam_as_admin = client(enforced, "iam")
    iam_as_admin.put_user_policy(UserName="u", PolicyName="s3", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": "s3:PutObject",
            "Resource": "arn:aws:s3:::work/${aws:PrincipalTag/dl-user}/*"}]}))
    client(enforced, "s3").create_bucket(Bucket="work")
    s3 = client(enforced, "s3", {**key, "SessionToken": ""})
    s3.put_object(Bucket="work", Key="u/x", Body=b"1")
    denied(lambda: s3.put_object(Bucket="work", Key="v/x", Body=b"1"))
    ie.disable()
    assert not ie.enabled()


def test_a_log_groups_arn_from_cloudformation_ends_in_a_wildcard_as_on_aws() -> None:
    """``Fn::GetAtt [LogGroup, Arn]`` is ``…:log-group:NAME:*`` (CloudFormation's return
    value), so the nodes' grant on it covers their streams once IAM is enforced."""
    from moto import mock_aws

    from emulator import moto_cloudformation

    moto_cloudformation.install()
    template = {"Resources": {"Logs": {"Type": "AWS::Logs::LogGroup",
                                       "Properties": {"LogGroupName": "/dl/x"}}},
                "Outputs": {"Arn": {"Value": {"Fn::GetAtt": ["Logs", "Arn"]}}}}
    with mock_aws():
        cfn = boto3.client("cloudformation", region_name="us-east-1")
        cfn.create_stack(StackName="S", TemplateBody=json.dumps(template))
        (out,) = cfn.describe_stacks(StackName="S")["Stacks"][0]["Outputs"]
    assert out["OutputValue"] == f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/dl/x:*"


def test_a_lambda_call_with_an_empty_body_passes_the_signature_check(enforced: str) -> None:
    """The emulated EC2 reading a new stack's function (``emulator.deploy.read_cluster``)
    signs GetFunctionConfiguration like any client: an empty body. moto alone checked it
    against its parsed parameters and answered SignatureDoesNotMatch."""
    ie.enable(ACCOUNT)
    lam = client(enforced, "lambda")
    with pytest.raises(ClientError) as exc:
        lam.get_function_configuration(FunctionName="absent")
    assert exc.value.response["Error"]["Code"] == "ResourceNotFoundException", exc.value
    ie.disable()

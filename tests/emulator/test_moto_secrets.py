"""``AWS::SecretsManager::Secret`` through moto's CloudFormation (``emulator/moto_secrets.py``)
and reading it with IAM enforced (``emulator/iam_enforcement.py``): a generated secret as
CloudFormation makes it, encrypted with the template's key; its value for a role that may get
it AND decrypt with its key, for nobody else, as AWS answers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator import iam_enforcement as ie

ACCOUNT = "123456789012"
REGION = "us-east-1"
EC2_TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "ec2.amazonaws.com"}}]}
TEMPLATE = {
    "Resources": {
        "Key": {"Type": "AWS::KMS::Key", "Properties": {"EnableKeyRotation": True, "KeyPolicy": {
            "Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Action": "kms:*", "Resource": "*",
                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}}]}}},
        "Munge": {"Type": "AWS::SecretsManager::Secret", "Properties": {
            "KmsKeyId": {"Fn::GetAtt": ["Key", "Arn"]},
            "GenerateSecretString": {"PasswordLength": 1024, "IncludeSpace": False}}},
        "Login": {"Type": "AWS::SecretsManager::Secret", "Properties": {
            "Name": "login", "GenerateSecretString": {
                "SecretStringTemplate": '{"user": "admin"}', "GenerateStringKey": "password",
                "PasswordLength": 12, "ExcludePunctuation": "true"}}},
    },
    "Outputs": {
        "Ref": {"Value": {"Ref": "Munge"}},
        "Id": {"Value": {"Fn::GetAtt": ["Munge", "Id"]}},
        "KeyArn": {"Value": {"Fn::GetAtt": ["Key", "Arn"]}},
    },
}


def client(endpoint: str, service: str, creds: dict | None = None):
    c = creds or {"AccessKeyId": "testing", "SecretAccessKey": "testing",
                  "SessionToken": "testing"}
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=c["AccessKeyId"],
                        aws_secret_access_key=c["SecretAccessKey"],
                        aws_session_token=c["SessionToken"])


@pytest.fixture()
def stack(moto_reset: str) -> Iterator[tuple[str, dict[str, str]]]:
    cfn = client(moto_reset, "cloudformation")
    cfn.create_stack(StackName="secrets", TemplateBody=json.dumps(TEMPLATE))
    outputs = {o["OutputKey"]: o["OutputValue"]
               for o in cfn.describe_stacks(StackName="secrets")["Stacks"][0]["Outputs"]}
    try:
        yield moto_reset, outputs
    finally:
        ie.disable()


def test_a_generated_secret_is_made_as_cloudformation_makes_it(stack) -> None:
    endpoint, out = stack
    sm = client(endpoint, "secretsmanager")
    assert out["Ref"] == out["Id"] and out["Ref"].startswith(
        f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:secrets-Munge-")
    value = sm.get_secret_value(SecretId=out["Ref"])["SecretString"]
    assert len(value) == 1024 and " " not in value
    assert sm.describe_secret(SecretId=out["Ref"])["KmsKeyId"] == out["KeyArn"]
    login = json.loads(sm.get_secret_value(SecretId="login")["SecretString"])
    assert login["user"] == "admin" and len(login["password"]) == 12
    assert login["password"].isalnum()


def test_deleting_the_stack_schedules_the_secret_for_deletion(stack) -> None:
    endpoint, out = stack
    client(endpoint, "cloudformation").delete_stack(StackName="secrets")
    sm = client(endpoint, "secretsmanager")
    assert "DeletedDate" in sm.describe_secret(SecretId=out["Ref"])
    with pytest.raises(ClientError, match=r"marked for deletion|InvalidRequest"):
        sm.get_secret_value(SecretId=out["Ref"])


def _role(iam, name: str, statements: list[dict]) -> str:
    arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(EC2_TRUST))[
        "Role"]["Arn"]
    if statements:
        iam.put_role_policy(RoleName=name, PolicyName="p", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": statements}))
    return arn


def test_only_a_role_that_may_get_it_and_decrypt_it_reads_it(stack) -> None:
    endpoint, out = stack
    iam = client(endpoint, "iam")
    get = {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": out["Ref"]}
    decrypt = {"Effect": "Allow", "Action": "kms:Decrypt", "Resource": out["KeyArn"],
               "Condition": {"StringEquals": {"kms:ViaService":
                                              f"secretsmanager.{REGION}.amazonaws.com"}}}
    roles = {"node": _role(iam, "node", [get, decrypt]),
             "no-decrypt": _role(iam, "no-decrypt", [get]),
             "decrypt-only": _role(iam, "decrypt-only", [decrypt]),
             "other": _role(iam, "other", [{**get, "Resource": f"{out['Ref']}-other"}])}
    ie.enable(ACCOUNT)
    sts = client(endpoint, "sts")
    readers = {}
    for name, arn in roles.items():
        creds = sts.assume_role(RoleArn=arn, RoleSessionName="i-1")["Credentials"]
        try:
            client(endpoint, "secretsmanager", creds).get_secret_value(SecretId=out["Ref"])
            readers[name] = "read"
        except ClientError as exc:
            code = exc.response["Error"]["Code"]  # moto's JSON services answer 403
            readers[name] = "denied" if code in ("AccessDenied", "403") else code
    assert readers == {"node": "read", "no-decrypt": "denied", "decrypt-only": "denied",
                       "other": "denied"}

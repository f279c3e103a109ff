"""dlc reads the caller's ``dl-user`` tag, where IAM lets it, to choose which Command
document to try (dlc/aws.py ``principal_tag``), against moto's IAM: an IAM user's tags, an
assumed role's role tags; anything it cannot read is None (dlc then maps the ARN). Which
document IAM lets the caller run is AWS's decision (docs/security.md), not this lookup's."""

from __future__ import annotations

import boto3

from dlc import aws
from dlc.target import Target

ACCOUNT = "123456789012"


def test_the_tag_of_the_callers_user_or_role_else_none(moto_reset: str) -> None:
    iam = boto3.client("iam", endpoint_url=moto_reset, region_name="us-east-1")
    iam.create_user(UserName="ops-alice", Path="/team/",
                    Tags=[{"Key": "dl-user", "Value": "alice"}])
    iam.create_user(UserName="untagged")
    iam.create_role(RoleName="Operators", AssumeRolePolicyDocument="{}",
                    Tags=[{"Key": "dl-user", "Value": "bob"}, {"Key": "x", "Value": "y"}])
    target = Target(region="us-east-1", endpoint=moto_reset,
                    credentials={"access_key_id": "AK", "secret_access_key": "SK"})
    assert aws.principal_tag(target, f"arn:aws:iam::{ACCOUNT}:user/team/ops-alice",
                             "dl-user") == "alice"
    assert aws.principal_tag(
        target, f"arn:aws:sts::{ACCOUNT}:assumed-role/Operators/bob@example.com",
        "dl-user") == "bob"
    for arn in (f"arn:aws:iam::{ACCOUNT}:user/untagged", f"arn:aws:iam::{ACCOUNT}:user/gone",
                f"arn:aws:sts::{ACCOUNT}:federated-user/carol", f"arn:aws:iam::{ACCOUNT}:root"):
        assert aws.principal_tag(target, arn, "dl-user") is None, arn

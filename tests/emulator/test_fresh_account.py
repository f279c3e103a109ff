"""A fresh account: KMS refuses a key policy naming a role that does not exist yet, so the
stack creates Auto Scaling's service-linked role and names it in no key policy: a grant made
after the role (``Custom::ServiceRoleGrant``) gives it the topic's key. The deploy is
of a Slurm cluster (``scheduler=slurm``), so it also shows the munge key's secret made from
the template and read, with IAM enforced, by the node roles and by no other principal.

AWS: "The principals in the key policy must exist and be visible to KMS" (CreateKey,
PutKeyPolicy); ``AWSServiceRoleForAutoScaling`` exists only once something created it.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator import deploy as dp
from emulator import iam_enforcement, moto_custom_resources, moto_kms
from tests.conftest import REGION
from tests.support.quotas import operator_quotas

ACCOUNT = "123456789012"
SLR_ARN = (f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/autoscaling.amazonaws.com/"
           "AWSServiceRoleForAutoScaling")


def key_policy(*principals: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "Admin", "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
         "Action": "kms:*", "Resource": "*"},
        {"Sid": "Publish", "Effect": "Allow", "Principal": {"AWS": list(principals)},
         "Action": ["kms:GenerateDataKey*", "kms:Decrypt"], "Resource": "*"}]})


def clients(endpoint: str):
    return (boto3.client("kms", region_name=REGION, endpoint_url=endpoint),
            boto3.client("iam", region_name=REGION, endpoint_url=endpoint))


def test_kms_refuses_a_key_policy_naming_a_missing_role(moto_reset):
    kms, iam = clients(moto_reset)
    with pytest.raises(ClientError) as exc:
        kms.create_key(Policy=key_policy(SLR_ARN))
    assert exc.value.response["Error"]["Code"] == "MalformedPolicyDocumentException"
    assert "AWSServiceRoleForAutoScaling" in str(exc.value)
    key_id = kms.create_key(Policy=key_policy(f"arn:aws:iam::{ACCOUNT}:root"))["KeyMetadata"][
        "KeyId"]
    with pytest.raises(ClientError) as exc:
        kms.put_key_policy(KeyId=key_id, PolicyName="default", Policy=key_policy(SLR_ARN))
    assert exc.value.response["Error"]["Code"] == "MalformedPolicyDocumentException"
    iam.create_service_linked_role(AWSServiceName="autoscaling.amazonaws.com")
    kms.create_key(Policy=key_policy(SLR_ARN))  # the role exists now: accepted
    kms.put_key_policy(KeyId=key_id, PolicyName="default", Policy=key_policy(SLR_ARN))


def test_kms_refuses_it_through_cloudformation_too(moto_reset):
    kms, _iam = clients(moto_reset)
    cfn = boto3.client("cloudformation", region_name=REGION, endpoint_url=moto_reset)
    template = {"Resources": {"Key": {"Type": "AWS::KMS::Key", "Properties": {
        "KeyPolicy": json.loads(key_policy(SLR_ARN))}}}}
    try:
        cfn.create_stack(StackName="key-only", TemplateBody=json.dumps(template))
    except ClientError as exc:
        assert "invalid principals" in str(exc)
    else:
        stack = cfn.describe_stacks(StackName="key-only")["Stacks"][0]
        assert stack["StackStatus"] != "CREATE_COMPLETE"
    assert kms.list_keys()["Keys"] == []


def test_a_signing_key_through_cloudformation_keeps_its_key_spec(moto_reset):
    """The cluster's membership key (ECC P-256, SIGN_VERIFY): moto's handler would make a
    symmetric key, on which Sign fails; the emulator creates it as CloudFormation does."""
    kms, _iam = clients(moto_reset)
    cfn = boto3.client("cloudformation", region_name=REGION, endpoint_url=moto_reset)
    template = {"Resources": {"Key": {"Type": "AWS::KMS::Key", "Properties": {
        "KeySpec": "ECC_NIST_P256", "KeyUsage": "SIGN_VERIFY",
        "KeyPolicy": json.loads(key_policy(f"arn:aws:iam::{ACCOUNT}:root"))}}}}
    cfn.create_stack(StackName="signing-key", TemplateBody=json.dumps(template))
    (key,) = kms.list_keys()["Keys"]
    meta = kms.describe_key(KeyId=key["KeyId"])["KeyMetadata"]
    assert (meta["KeySpec"], meta["KeyUsage"]) == ("ECC_NIST_P256", "SIGN_VERIFY")
    signed = kms.sign(KeyId=key["KeyId"], Message=b"m" * 32, MessageType="DIGEST",
                      SigningAlgorithm="ECDSA_SHA_256")["Signature"]
    assert kms.verify(KeyId=key["KeyId"], Message=b"m" * 32, MessageType="DIGEST",
                      Signature=signed, SigningAlgorithm="ECDSA_SHA_256")["SignatureValid"]


def test_a_second_create_service_linked_role_answers_as_aws_does(moto_reset):
    _kms, iam = clients(moto_reset)
    iam.create_service_linked_role(AWSServiceName="autoscaling.amazonaws.com")
    with pytest.raises(ClientError) as exc:
        iam.create_service_linked_role(AWSServiceName="autoscaling.amazonaws.com")
    assert exc.value.response["Error"]["Code"] == "InvalidInput"
    assert "has been taken in this account" in str(exc.value)


def test_principals_other_than_this_accounts_roles_and_users_are_not_checked():
    def nothing_exists(*_args):
        return False

    policy = key_policy(f"arn:aws:iam::{ACCOUNT}:root", "arn:aws:iam::210987654321:role/x",
                        f"arn:aws:iam::{ACCOUNT}:user/alice", "*")
    assert moto_kms.missing_principals(policy, ACCOUNT, nothing_exists) == [
        f"arn:aws:iam::{ACCOUNT}:user/alice"]


def test_the_custom_aws_player_accepts_only_the_declared_error_codes(moto_reset):
    create = {"service": "IAM", "action": "CreateServiceLinkedRole",
              "parameters": {"AWSServiceName": "autoscaling.amazonaws.com"},
              "physicalResourceId": {"id": "AWSServiceRoleForAutoScaling"}}
    props = {"Create": json.dumps({**create, "ignoreErrorCodesMatching": "InvalidInput"})}
    # moto's backends live in this process (the test session's moto server)
    moto_custom_resources.play("Slr", props, ACCOUNT, REGION)  # creates the role
    moto_custom_resources.play("Slr", props, ACCOUNT, REGION)  # exists: "taken", accepted
    with pytest.raises(moto_custom_resources.CustomResourceError, match="InvalidInput"):
        moto_custom_resources.play("Slr", {"Create": json.dumps(create)}, ACCOUNT, REGION)
    with pytest.raises(moto_custom_resources.CustomResourceError, match="cannot play"):
        moto_custom_resources.play("X", {"Create": json.dumps(
            {"service": "S3", "action": "DeleteBucket"})}, ACCOUNT, REGION)


@pytest.mark.slow
def test_the_stack_deploys_on_a_fresh_account(moto_reset, tmp_path: Path):
    """``cdk deploy DLClusterStack`` on a fresh account: its G vCPU quota of 0 refuses the
    deploy before any group launches (the stack's own check, not only ``dlc up``'s), naming
    the quota, its value, the need and the request command; once the operator's increase
    went through, the stack creates Auto Scaling's service-linked role and grants it the
    topic's key once KMS accepts it as a grantee."""
    _kms, iam = clients(moto_reset)
    assert not [r for r in iam.list_roles()["Roles"] if r["RoleName"].startswith(
        "AWSServiceRoleForAutoScaling")]
    env = dp.cli_env(moto_reset)
    log, out = tmp_path / "cdk.log", tmp_path / "cdk.out"
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_reset)
    asg = boto3.client("autoscaling", region_name=REGION, endpoint_url=moto_reset)
    cfn = boto3.client("cloudformation", region_name=REGION, endpoint_url=moto_reset)
    dp.bootstrap(env, log, out)
    ami = dp.pick_ami(ec2)
    slurm = {"scheduler": "slurm"}  # the munge key's readers are checked below
    with pytest.raises(dp.DeployError) as refused:
        dp.deploy(env, log, out, workers=1, ami=ami, context=slurm)
    message = str(refused.value)
    for part in ("'Running On-Demand G and VT instances' (L-DB2E81BA)", "the quota in "
                 "us-east-1 is 0", "need 8 vCPUs", "request-service-quota-increase "
                 "--service-code ec2 --quota-code L-DB2E81BA --desired-value 8"):
        assert part in message, message
    assert asg.describe_auto_scaling_groups()["AutoScalingGroups"] == []  # none launched
    cfn.delete_stack(StackName=dp.STACK)  # what the refused change set left
    operator_quotas(moto_reset)  # the operator's increase
    dp.deploy(env, log, out, workers=1, ami=ami, context=slurm)
    assert cfn.describe_stacks(StackName=dp.STACK)["Stacks"][0]["StackStatus"] in (
        "CREATE_COMPLETE", "UPDATE_COMPLETE")
    role = iam.get_role(RoleName="AWSServiceRoleForAutoScaling")["Role"]
    assert role["Arn"] == SLR_ARN
    kms = boto3.client("kms", region_name=REGION, endpoint_url=moto_reset)
    grantees = [g["GranteePrincipal"] for k in kms.list_keys()["Keys"]
                for g in kms.list_grants(KeyId=k["KeyId"])["Grants"]]
    assert grantees == [SLR_ARN]  # the topic's key, granted by the stack's custom resource
    assert munge_key_readers(moto_reset, cfn, iam) == {
        "master": "read", "worker": "read", "capacity adjuster": "denied"}


def munge_key_readers(endpoint: str, cfn, iam) -> dict[str, str]:
    """Who of the deployed stack's roles reads the munge key with IAM enforced (each as a
    session of its role, assumed by the emulator's admin session as AWS's services would)."""
    resources = cfn.describe_stack_resources(StackName=dp.STACK)["StackResources"]
    (secret,) = [r["PhysicalResourceId"] for r in resources
                 if r.get("ResourceType") == "AWS::SecretsManager::Secret"]
    sm = boto3.client("secretsmanager", region_name=REGION, endpoint_url=endpoint)
    assert len(sm.get_secret_value(SecretId=secret)["SecretString"]) == 1024
    roles = {name: next(r["PhysicalResourceId"] for r in resources
                        if r.get("ResourceType") == "AWS::IAM::Role"
                        and r.get("LogicalResourceId", "").startswith(prefix))
             for name, prefix in (("master", "ClusterMasterGroupInstanceRole"),
                                  ("worker", "ClusterWorkerGroupInstanceRole"),
                                  ("capacity adjuster", "ClusterCapacityAdjusterRole"))}
    arns = {name: iam.get_role(RoleName=r)["Role"]["Arn"] for name, r in roles.items()}
    out = {}
    iam_enforcement.enable(ACCOUNT)
    try:
        sts = boto3.client("sts", region_name=REGION, endpoint_url=endpoint)
        for name, arn in arns.items():
            c = sts.assume_role(RoleArn=arn, RoleSessionName="i-1")["Credentials"]
            reader = boto3.client(
                "secretsmanager", region_name=REGION, endpoint_url=endpoint,
                aws_access_key_id=c["AccessKeyId"], aws_secret_access_key=c["SecretAccessKey"],
                aws_session_token=c["SessionToken"])
            try:
                reader.get_secret_value(SecretId=secret)
                out[name] = "read"
            except ClientError as exc:
                code = exc.response["Error"]["Code"]  # moto's JSON services answer 403
                out[name] = "denied" if code in ("AccessDenied", "403") else code
    finally:
        iam_enforcement.disable()
    return out


def test_the_custom_resources_act_as_the_administrator_with_iam_enforced(moto_reset):
    """The project's custom-resource code (a stack's release, its checks) runs in moto's
    process with the harness's session. With IAM enforced that session is the
    administrator's role session, which moto refuses without its token: a stack's deletion
    failed on its release (``InvalidClientTokenId``, found by the resume drill)."""
    moto_custom_resources.serve_at(moto_reset)
    iam_enforcement.enable(ACCOUNT)
    try:
        clients = moto_custom_resources.HarnessClients(REGION)
        groups = clients.autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
    finally:
        iam_enforcement.disable()
    assert groups == []

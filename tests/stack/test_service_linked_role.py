"""Auto Scaling's service-linked role (new on a fresh account) may use the notification
topic's key without racing IAM's propagation: the key's policy never names it (KMS refuses a
principal it cannot see yet, and CloudFormation does not retry), a ``Custom::ServiceRoleGrant``
made after the role exists gives it the publish operations (retried until KMS sees the role:
tests/lambda/test_service_role_grant.py), and the topic waits for that grant."""

from __future__ import annotations

import json

from tests.stack.synth import cluster_template

ROLE = "AWSServiceRoleForAutoScaling"


def _depends(resource: dict) -> set[str]:
    depends = resource.get("DependsOn") or []
    return {depends} if isinstance(depends, str) else set(depends)


def test_the_role_is_created_and_never_deleted():
    t = cluster_template().to_json()["Resources"]
    (slr_id,) = [k for k, v in t.items() if v["Type"] == "Custom::AWS"
                 and "CreateServiceLinkedRole" in json.dumps(v["Properties"].get("Create"))]
    create = json.loads(t[slr_id]["Properties"]["Create"])
    assert create["parameters"] == {"AWSServiceName": "autoscaling.amazonaws.com"}
    assert create["ignoreErrorCodesMatching"] == "InvalidInput"  # "has been taken": fine
    assert "Delete" not in t[slr_id]["Properties"]  # the account's role is never deleted
    # the provider may create that one role and nothing else
    policies = [v["Properties"]["PolicyDocument"]["Statement"] for v in t.values()
                if v["Type"] == "AWS::IAM::Policy"
                and "iam:CreateServiceLinkedRole" in json.dumps(v["Properties"])]
    (statements,) = policies
    (statement,) = statements
    assert statement["Condition"] == {"StringEquals": {
        "iam:AWSServiceName": "autoscaling.amazonaws.com"}}
    assert ROLE in json.dumps(statement["Resource"])


def test_no_key_policy_names_the_new_role_a_grant_made_after_it_does():
    t = cluster_template().to_json()["Resources"]
    keys = [k for k, v in t.items() if v["Type"] == "AWS::KMS::Key"]
    assert keys and not [k for k in keys if ROLE in json.dumps(t[k]["Properties"]["KeyPolicy"])]
    (slr_id,) = [k for k, v in t.items() if v["Type"] == "Custom::AWS"
                 and "CreateServiceLinkedRole" in json.dumps(v["Properties"].get("Create"))]
    (grant_id,) = [k for k, v in t.items() if v["Type"] == "Custom::ServiceRoleGrant"]
    grant = t[grant_id]
    props = grant["Properties"]
    assert ROLE in json.dumps(props["GranteePrincipal"])
    assert props["Operations"] == ["GenerateDataKey", "Decrypt"]
    (key_id,) = [k for k in keys if props["KeyArn"] == {"Fn::GetAtt": [k, "Arn"]}]
    (topic_id,) = [k for k, v in t.items() if v["Type"] == "AWS::SNS::Topic"
                   and v["Properties"].get("KmsMasterKeyId") == {"Fn::GetAtt": [key_id, "Arn"]}]
    (adjuster,) = [k for k, v in t.items() if v["Type"] == "AWS::Lambda::Function"
                   and v["Properties"].get("Handler") == "capacity_adjuster.handler"]
    assert props["ServiceToken"] == {"Fn::GetAtt": [adjuster, "Arn"]}
    assert slr_id in _depends(grant)  # the role exists first
    assert grant_id in _depends(t[topic_id])  # nothing publishes before the grant
    # the answering function may grant exactly this grantee exactly these operations
    (policy_id,) = [k for k, v in t.items() if v["Type"] == "AWS::IAM::Policy"
                    and "GrantTheServiceRoleItsKeyOperations" in json.dumps(v["Properties"])]
    assert policy_id in _depends(grant)
    statements = {s.get("Sid"): s for s in
                  t[policy_id]["Properties"]["PolicyDocument"]["Statement"]}
    create = statements["GrantTheServiceRoleItsKeyOperations"]
    assert create["Action"] == "kms:CreateGrant"
    assert create["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert create["Condition"]["StringEquals"] == {
        "kms:GranteePrincipal": props["GranteePrincipal"]}
    assert create["Condition"]["ForAllValues:StringEquals"] == {
        "kms:GrantOperations": ["GenerateDataKey", "Decrypt"]}
    revoke = statements["RevokeTheServiceRolesGrantAtDeletion"]
    assert (revoke["Action"], revoke["Resource"]) == ("kms:RevokeGrant",
                                                      {"Fn::GetAtt": [key_id, "Arn"]})

"""The topic's key names Auto Scaling's service-linked role only after the stack made sure
the role exists (a fresh account has none, and KMS refuses a policy naming it)."""

from __future__ import annotations

import json

from tests.stack.synth import cluster_template


def test_the_key_waits_for_the_service_linked_role():
    t = cluster_template().to_json()["Resources"]
    (slr_id,) = [k for k, v in t.items() if v["Type"] == "Custom::AWS"
                 and "CreateServiceLinkedRole" in json.dumps(v["Properties"].get("Create"))]
    create = json.loads(t[slr_id]["Properties"]["Create"])
    assert create["parameters"] == {"AWSServiceName": "autoscaling.amazonaws.com"}
    assert create["ignoreErrorCodesMatching"] == "InvalidInput"  # "has been taken": fine
    assert "Delete" not in t[slr_id]["Properties"]  # the account's role is never deleted
    # the notification topic's key (the flow logs have a key of their own)
    (key_id,) = [k for k, v in t.items() if v["Type"] == "AWS::KMS::Key"
                 and "AWSServiceRoleForAutoScaling" in json.dumps(v["Properties"]["KeyPolicy"])]
    assert slr_id in t[key_id]["DependsOn"]
    # the provider may create that one role and nothing else
    policies = [v["Properties"]["PolicyDocument"]["Statement"] for v in t.values()
                if v["Type"] == "AWS::IAM::Policy"
                and "iam:CreateServiceLinkedRole" in json.dumps(v["Properties"])]
    (statements,) = policies
    (statement,) = statements
    assert statement["Condition"] == {"StringEquals": {
        "iam:AWSServiceName": "autoscaling.amazonaws.com"}}
    assert "AWSServiceRoleForAutoScaling" in json.dumps(statement["Resource"])

"""The VPC's flow logs are encrypted with a customer-managed, rotating key that CloudWatch
Logs may use for this account's log groups only (the EMR log bucket: tests/emr/
test_emr_log_bucket.py)."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from tests.stack.synth import cluster_template


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template()


def test_flow_logs_are_encrypted_with_their_own_rotating_key(template: Template) -> None:
    (group,) = [g["Properties"] for k, g in template.find_resources("AWS::Logs::LogGroup").items()
                if "FlowLogs" in k]
    (key_id,) = [k for k in template.find_resources("AWS::KMS::Key") if "FlowLogKey" in k]
    assert group["KmsKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    key = template.find_resources("AWS::KMS::Key")[key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    (logs,) = [s for s in key["KeyPolicy"]["Statement"]
               if s.get("Sid") == "CloudWatchLogsEncryptsFlowLogs"]
    assert logs["Principal"] == {"Service": {"Fn::Join": [
        "", ["logs.", {"Ref": "AWS::Region"}, ".amazonaws.com"]]}}
    assert "kms:GenerateDataKey*" in logs["Action"] and "kms:Decrypt*" in logs["Action"]
    context = logs["Condition"]["StringLike"]["kms:EncryptionContext:aws:logs:arn"]
    assert context["Fn::Join"][1][-1] == ":log-group:*"
    assert {"Ref": "AWS::AccountId"} in context["Fn::Join"][1]

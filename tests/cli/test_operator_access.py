"""The operator policy (constructs_lib/operator_access.py): exactly what dlc calls, Run
Command only with the cluster's own document and sessions only on instances tagged with the
cluster's id, no shell (that is the separate admin policy), and the stack outputs."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from constructs_lib.operator_access import OperatorAccess


def arn(value: object) -> object:
    """An ARN built with the partition pseudo parameter, as text in the aws partition."""
    if isinstance(value, list):
        return [arn(v) for v in value]
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join("aws" if p == {"Ref": "AWS::Partition"} else str(p) for p in parts)
    return value


def synth(**props) -> Template:
    app = cdk.App()
    stack = cdk.Stack(app, "Ops", env=cdk.Environment(account="123456789012",
                                                       region="eu-west-1"))
    OperatorAccess(stack, "Access", cluster_id="c-1", **props)
    return Template.from_stack(stack)


def statements(*, admin: bool = False, **props) -> dict[str, dict]:
    policies = synth(**props).find_resources("AWS::IAM::ManagedPolicy")
    (policy,) = [p for k, p in policies.items() if ("AdminSession" in k) == admin]
    return {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


TAG = {"StringEquals": {"ssm:resourceTag/dl-cluster:id": "c-1"}}
CHECK = {"BoolIfExists": {"ssm:SessionDocumentAccessCheck": "true"}}


def test_run_command_is_the_clusters_document_on_this_clusters_instances_only() -> None:
    s = statements()
    (doc_id,) = synth().find_resources("AWS::SSM::Document")
    assert arn(s["RunTheClusterDocumentOnly"]["Resource"]) == \
        "arn:aws:ssm:eu-west-1:123456789012:document/" + str({"Ref": doc_id})
    assert "Condition" not in s["RunTheClusterDocumentOnly"]
    assert s["RunCommandOnThisClusterOnly"]["Condition"] == TAG
    assert arn(s["RunCommandOnThisClusterOnly"]["Resource"]) == \
        "arn:aws:ec2:eu-west-1:123456789012:instance/*"
    assert s["ReadTheClusterStack"]["Resource"] == {"Ref": "AWS::StackId"}


def test_no_shell_for_operators() -> None:
    """Not AWS-RunShellScript, and no session document that is a shell: port forwarding
    only, with the check that stops a StartSession without a document from opening the
    default shell."""
    s = statements()
    assert "AWS-RunShellScript" not in json.dumps(s)
    assert "SSM-SessionManagerRunShell" not in json.dumps(s)
    assert s["TunnelsOnThisClusterOnly"]["Condition"] == {**TAG, **CHECK}
    assert arn(s["TunnelsDocuments"]["Resource"]) == \
        "arn:aws:ssm:eu-west-1::document/AWS-StartPortForwardingSession"
    assert s["OwnSessionsOnly"]["Action"] == ["ssm:TerminateSession", "ssm:ResumeSession"]
    with pytest.raises(ValueError, match="OperatorAccess Access: tunnel_documents"):
        synth(tunnel_documents=("SSM-SessionManagerRunShell",))


def test_the_shell_is_a_separate_admin_policy() -> None:
    s = statements(admin=True)
    assert set(s) == {"ShellsOnThisClusterOnly", "ShellsDocuments", "OwnSessionsOnly"}
    assert s["ShellsOnThisClusterOnly"]["Condition"] == {**TAG, **CHECK}
    assert arn(s["ShellsDocuments"]["Resource"]) == \
        "arn:aws:ssm:eu-west-1:123456789012:document/SSM-SessionManagerRunShell"


def test_every_action_is_one_dlc_uses() -> None:
    actions = set()
    for st in statements().values():
        actions |= set([st["Action"]] if isinstance(st["Action"], str) else st["Action"])
    assert actions == {
        "cloudformation:DescribeStacks", "cloudformation:DescribeStackEvents",
        "cloudformation:DescribeStackResources", "autoscaling:DescribeAutoScalingGroups",
        "ec2:DescribeInstances", "ssm:SendCommand", "ssm:GetCommandInvocation",
        "ssm:StartSession", "ssm:TerminateSession", "ssm:ResumeSession",
        "pricing:GetProducts"}
    assert "PriceListForCostEstimates" not in statements(allow_pricing=False)


def test_every_document_parameter_has_an_allowed_pattern() -> None:
    (doc,) = synth().find_resources("AWS::SSM::Document").values()
    props = doc["Properties"]
    assert (props["DocumentType"], props["Content"]["schemaVersion"]) == ("Command", "2.2")
    params = props["Content"]["parameters"]
    assert set(params) == {"command", "arguments", "runAs", "outputOffset", "outputLimit",
                           "workdir", "executionTimeout"}
    assert all(p.get("allowedPattern", "").startswith("^") for p in params.values())
    assert {n for n, p in params.items() if p.get("interpolationType") == "ENV_VAR"} == \
        set(params) - {"executionTimeout"}


def test_the_stack_outputs_the_policy_arn() -> None:
    import app as app_module
    from tests.stack.synth import new_app

    app = app_module.build_app(new_app())
    template = Template.from_stack(app.node.find_child("DLClusterStack"))
    out = template.find_outputs("OperatorPolicyArn")
    assert list(out) == ["OperatorPolicyArn"]
    policies = template.find_resources("AWS::IAM::ManagedPolicy")
    (policy_id,) = [k for k in policies if "AdminSession" not in k]
    (admin_id,) = [k for k in policies if "AdminSession" in k]
    assert out["OperatorPolicyArn"]["Value"] == {"Ref": policy_id}
    admin = template.find_outputs("AdminSessionPolicyArn")
    assert admin["AdminSessionPolicyArn"]["Value"] == {"Ref": admin_id}


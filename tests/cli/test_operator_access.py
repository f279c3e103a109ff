"""The operator policy (constructs_lib/operator_access.py): exactly what dlc calls, Run
Command and sessions only on instances tagged with the cluster's id, and the stack output."""

from __future__ import annotations

import aws_cdk as cdk
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


def statements(**props) -> dict[str, dict]:
    app = cdk.App()
    stack = cdk.Stack(app, "Ops", env=cdk.Environment(account="123456789012",
                                                       region="eu-west-1"))
    OperatorAccess(stack, "Access", cluster_id="c-1", **props)
    policies = Template.from_stack(stack).find_resources("AWS::IAM::ManagedPolicy")
    (policy,) = policies.values()
    return {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


def test_run_command_and_sessions_only_on_this_clusters_instances() -> None:
    s = statements()
    tag = {"StringEquals": {"ssm:resourceTag/dl-cluster:id": "c-1"}}
    for sid in ("RunCommandOnThisClusterOnly", "SessionsOnThisClusterOnly"):
        assert s[sid]["Condition"] == tag
        assert arn(s[sid]["Resource"]) == "arn:aws:ec2:eu-west-1:123456789012:instance/*"
    assert arn(s["RunCommandDocument"]["Resource"]) == \
        "arn:aws:ssm:eu-west-1::document/AWS-RunShellScript"
    assert "Condition" not in s["RunCommandDocument"]
    assert set(arn(s["SessionDocuments"]["Resource"])) == {
        "arn:aws:ssm:eu-west-1::document/AWS-StartPortForwardingSession",
        "arn:aws:ssm:eu-west-1:123456789012:document/SSM-SessionManagerRunShell"}
    assert s["ReadTheClusterStack"]["Resource"] == {"Ref": "AWS::StackId"}
    assert s["OwnSessionsOnly"]["Action"] == ["ssm:TerminateSession", "ssm:ResumeSession"]


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


def test_the_stack_outputs_the_policy_arn() -> None:
    import app as app_module
    from tests.stack.synth import new_app

    app = app_module.build_app(new_app())
    template = Template.from_stack(app.node.find_child("DLClusterStack"))
    out = template.find_outputs("OperatorPolicyArn")
    assert list(out) == ["OperatorPolicyArn"]
    (policy_id,) = template.find_resources("AWS::IAM::ManagedPolicy")
    assert out["OperatorPolicyArn"]["Value"] == {"Ref": policy_id}

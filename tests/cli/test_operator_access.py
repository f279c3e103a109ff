"""The operator policy (constructs_lib/operator_access.py): exactly what dlc calls, Run
Command only with the caller's own per-user document (named by an IAM policy variable on
the caller's ``dl-user`` principal tag) and sessions only on instances tagged with the
cluster's id, no shell and no any-user document (both are the separate admin policy's), and
the stack outputs. moto does not evaluate IAM for SSM: that IAM substitutes the principal
tag into the document ARN is AWS's documented behaviour (docs/security.md links it); these
tests prove the policy's shape."""

from __future__ import annotations

import json
import re

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


#: The operator policy's one document: the caller's own user's, by the principal tag.
OWN_DOCUMENT = "arn:aws:ssm:eu-west-1:123456789012:document/dl-op.c-1.${aws:PrincipalTag/dl-user}"


def send_command_resources(s: dict[str, dict]) -> set[str]:
    out: set[str] = set()
    for st in s.values():
        if "ssm:SendCommand" in ([st["Action"]] if isinstance(st["Action"], str) else
                                 st["Action"]):
            res = arn(st["Resource"])
            out |= {json.dumps(r) if isinstance(r, dict) else r
                    for r in (res if isinstance(res, list) else [res])}
    return out


def test_run_command_is_the_clusters_document_on_this_clusters_instances_only() -> None:
    s = statements()
    assert arn(s["RunOwnUsersDocumentOnly"]["Resource"]) == OWN_DOCUMENT
    assert "Condition" not in s["RunOwnUsersDocumentOnly"]
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


def test_operators_run_only_their_own_users_document_through_the_principal_tag() -> None:
    """SendCommand: the per-user document the caller's dl-user tag names, and the
    cluster's tagged instances; never the any-user document (whose runAs would let an
    operator pick any user), whichever users the cluster has."""
    template = synth(cluster_users=("alice", "bob"))
    s = statements(cluster_users=("alice", "bob"))
    assert send_command_resources(s) == {
        OWN_DOCUMENT, "arn:aws:ec2:eu-west-1:123456789012:instance/*"}
    documents = template.find_resources("AWS::SSM::Document")
    (anyone,) = [k for k, d in documents.items() if "Name" not in d["Properties"]]
    assert anyone not in json.dumps(s)
    named = {d["Properties"]["Name"]: d["Properties"]["Content"] for d in documents.values()
             if "Name" in d["Properties"]}
    assert set(named) == {"dl-op.c-1.alice", "dl-op.c-1.bob"}
    for user in ("alice", "bob"):
        content = named[f"dl-op.c-1.{user}"]
        assert "runAs" not in content["parameters"]  # the user is the document's own
        script = content["mainSteps"][0]["inputs"]["runCommand"]
        assert f'if [ "$SSM_command" = dl-run ]; then user={user}; fi' in script
        assert f'  set -- env DL_OPERATOR_USER={user} "$SSM_command"' in script
        assert not any("SSM_runAs" in line for line in script)


def test_the_any_user_document_is_the_admin_policys() -> None:
    template = synth(cluster_users=("alice",))
    (anyone,) = [k for k, d in template.find_resources("AWS::SSM::Document").items()
                 if "Name" not in d["Properties"]]
    s = statements(admin=True, cluster_users=("alice",))
    assert arn(s["RunTheAnyUserDocument"]["Resource"]) == \
        "arn:aws:ssm:eu-west-1:123456789012:document/" + str({"Ref": anyone})
    assert s["RunCommandOnThisClusterOnly"]["Condition"] == TAG
    assert OWN_DOCUMENT not in send_command_resources(s)


@pytest.mark.parametrize(("props", "message"), [
    ({"cluster_users": ("root",)}, "cluster_users: root: jobs never run as root"),
    ({"cluster_users": ("Alice",)}, "cluster_users: 'Alice' is not a Linux user name"),
    ({"cluster_users": ("al", "al")}, "cluster_users names 'al' twice"),
    ({"cluster_users": ("al\n; id",)}, "cluster_users: 'al\\n; id' is not a Linux user"),
    ({"cluster_users": ("al\n",)}, "cluster_users: 'al\\n' is not a Linux user"),
    ({"cluster_users": ("al",), "cluster_id": "c-1\n"}, "cluster_id 'c-1\\n' may hold"),
    ({"cluster_users": ("al",), "cluster_id": "c.1"}, "cluster_id 'c.1' may hold letters"),
    ({"cluster_users": ("al",), "cluster_id": "c" * 120}, "the document name 'dl-op.c"),
])
def test_cluster_users_and_the_cluster_id_make_valid_document_names(props, message) -> None:
    app = cdk.App()
    stack = cdk.Stack(app, "Ops")
    with pytest.raises(ValueError, match=re.escape(f"OperatorAccess Access: {message}")):
        OperatorAccess(stack, "Access", **{"cluster_id": "c-1", **props})


def test_the_stack_makes_a_document_per_cluster_user() -> None:
    """``-c clusterUsers=alice,bob``: the stack's documents are named for its cluster id."""
    from tests.stack.synth import cluster_template

    template = cluster_template(clusterUsers="alice,bob")
    names = sorted(d["Properties"].get("Name", "")
                   for d in template.find_resources("AWS::SSM::Document").values())
    assert names == ["", "dl-op.DLClusterStack.alice", "dl-op.DLClusterStack.bob"]


def test_the_shell_is_a_separate_admin_policy() -> None:
    s = statements(admin=True)
    assert set(s) == {"ShellsOnThisClusterOnly", "ShellsDocuments", "OwnSessionsOnly",
                      "RunTheAnyUserDocument", "RunCommandOnThisClusterOnly"}
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
        "pricing:GetProducts", "ce:ListCostAllocationTags"}
    without = statements(allow_pricing=False)
    assert "PriceListForCostEstimates" not in without and "CostTagStatus" not in without


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


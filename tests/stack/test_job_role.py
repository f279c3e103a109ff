"""The job role (constructs_lib/job_role.py): jobs' own AWS identity, assumable only by the
cluster's node roles with the job's user as a session tag, and named in every node's user
data so the executor can assume it."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Template

from constructs_lib.job_role import USER_TAG, JobRole
from tests.stack.synth import cluster_template


def logical_id(template: Template, type_: str, path_part: str) -> str:
    """The one resource of ``type_`` whose logical id starts with the cluster's construct
    path ``path_part`` (CDK builds logical ids from construct paths)."""
    prefix = "Cluster" + path_part.strip("/").replace("/", "")
    (found,) = [k for k in template.find_resources(type_) if k.startswith(prefix)
                and k[len(prefix):].isalnum() and len(k) - len(prefix) == 8]
    return found


def test_only_the_node_roles_may_assume_it_and_must_tag_the_user():
    t = cluster_template()
    job = logical_id(t, "AWS::IAM::Role", "/JobRole/")
    trust = t.to_json()["Resources"][job]["Properties"]["AssumeRolePolicyDocument"]
    principals = []
    for st in trust["Statement"]:
        assert st["Effect"] == "Allow"
        assert sorted(st["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
        principals.append(json.dumps(st["Principal"]))
    node_roles = [logical_id(t, "AWS::IAM::Role", f"/{g}/InstanceRole/")
                  for g in ("MasterGroup", "WorkerGroup")]
    for role in node_roles:
        assert any(role in p for p in principals), (role, principals)
    assert len(trust["Statement"]) == len(node_roles) or \
        len(trust["Statement"][0]["Principal"]["AWS"]) == len(node_roles)
    assert t.to_json()["Resources"][job]["Properties"]["MaxSessionDuration"] == 3600


def test_node_roles_may_assume_the_job_role_and_nothing_else_of_sts():
    t = cluster_template()
    job = logical_id(t, "AWS::IAM::Role", "/JobRole/")
    for policy in t.find_resources("AWS::IAM::Policy").values():
        for st in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            if any(a.startswith("sts:") for a in actions):
                assert sorted(actions) == ["sts:AssumeRole", "sts:TagSession"]
                assert st["Resource"] == {"Fn::GetAtt": [job, "Arn"]}


def test_every_nodes_user_data_names_the_job_role():
    t = cluster_template()
    job = logical_id(t, "AWS::IAM::Role", "/JobRole/")
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        text = json.dumps(lt["Properties"]["LaunchTemplateData"]["UserData"])
        assert "--job-role-arn" in text and json.dumps([job, "Arn"]) in text


def test_a_user_prefix_grant_is_scoped_by_the_session_tag():
    stack = cdk.Stack(cdk.App(), "S")
    node = iam.Role(stack, "Node", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    role = JobRole(stack, "Jobs", node_roles=[node], cluster_id="c1")
    bucket = s3.Bucket(stack, "B")
    role.grant_user_prefix_read_write(bucket, "checkpoints/c1/")
    text = json.dumps(Template.from_stack(stack).find_resources("AWS::IAM::Policy"))
    assert f"/checkpoints/c1/${{aws:PrincipalTag/{USER_TAG}}}/*" in text


def test_without_node_roles_it_says_which_construct():
    stack = cdk.Stack(cdk.App(), "S")
    with pytest.raises(ValueError, match="S/Jobs: node_roles must name at least one role"):
        JobRole(stack, "Jobs", node_roles=[], cluster_id="c1")

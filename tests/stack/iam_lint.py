"""Every IAM policy of a synthesized template, with its intrinsics resolved, for parliament.

parliament (https://github.com/duo-labs/parliament) reads policy JSON, not CloudFormation, so
each ``Ref``/``Fn::GetAtt``/``Fn::Join``/``Fn::Sub`` becomes a plausible literal of the right
shape: the ARN format AWS documents for the referenced resource type, in account
123456789012 and region us-east-1. Nothing else of the policy changes.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ACCOUNT, REGION, PARTITION = "123456789012", "us-east-1", "aws"
PSEUDO = {"AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::Partition": PARTITION,
          "AWS::StackName": "Stack", "AWS::URLSuffix": "amazonaws.com",
          "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/Stack/id"}
#: resource type -> (what ``Ref`` returns, what ``Fn::GetAtt .Arn`` returns); {id} = logical id
SHAPES: dict[str, tuple[str, str]] = {
    "AWS::SQS::Queue": (f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{{id}}",
                        f"arn:aws:sqs:{REGION}:{ACCOUNT}:{{id}}"),
    "AWS::SNS::Topic": (f"arn:aws:sns:{REGION}:{ACCOUNT}:{{id}}",
                        f"arn:aws:sns:{REGION}:{ACCOUNT}:{{id}}"),
    "AWS::KMS::Key": ("{id}", f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{{id}}"),
    "AWS::EFS::FileSystem": ("fs-0123456789abcdef0",
                             f"arn:aws:elasticfilesystem:{REGION}:{ACCOUNT}:"
                             "file-system/fs-0123456789abcdef0"),
    "AWS::S3::Bucket": ("{lid}", "arn:aws:s3:::{lid}"),
    "AWS::Logs::LogGroup": ("{id}", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{{id}}:*"),
    "AWS::Lambda::Function": ("{id}", f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{{id}}"),
    "AWS::IAM::Role": ("{id}", f"arn:aws:iam::{ACCOUNT}:role/{{id}}"),
    "AWS::EC2::SecurityGroup": ("sg-0123456789abcdef0", ""),
    "AWS::EMR::Cluster": ("j-0123456789ABC", ""),
    "AWS::AutoScaling::AutoScalingGroup": ("{id}", ""),
    "AWS::SecretsManager::Secret": (f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{{id}}"
                                    "-AbCdEf", ""),
}


@dataclass(frozen=True)
class FoundPolicy:
    """One policy document: where it is (``<logical id>.<property>``), and its kind."""

    where: str
    kind: str  # "identity" | "resource" | "trust"
    document: dict


def _resolve(value: Any, resources: dict) -> Any:
    if isinstance(value, list):
        return [_resolve(v, resources) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Ref"}:
        name = value["Ref"]
        if name in PSEUDO:
            return PSEUDO[name]
        return _shape(name, resources, 0)
    if set(value) == {"Fn::GetAtt"}:
        name, attribute = value["Fn::GetAtt"]
        return _shape(name, resources, 1) if attribute == "Arn" else f"{name}-{attribute}"
    if set(value) == {"Fn::Join"}:
        sep, parts = value["Fn::Join"]
        return sep.join(str(_resolve(p, resources)) for p in parts)
    if set(value) == {"Fn::Sub"}:
        text = value["Fn::Sub"] if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"][0]
        return re.sub(r"\$\{([^}]+)\}", lambda m: str(_resolve(
            {"Ref": m.group(1)} if "." not in m.group(1)
            else {"Fn::GetAtt": m.group(1).split(".", 1)}, resources)), text)
    if set(value) == {"Fn::Select"}:
        index, items = value["Fn::Select"]
        return _resolve(items, resources)[int(index)]
    if set(value) == {"Fn::Split"}:
        sep, text = value["Fn::Split"]
        return str(_resolve(text, resources)).split(sep)
    return {k: _resolve(v, resources) for k, v in value.items()}


def _shape(logical_id: str, resources: dict, which: int) -> str:
    kind = resources.get(logical_id, {}).get("Type", "")
    template = SHAPES.get(kind, ("{id}", ""))[which] or "{id}"
    return template.format(id=logical_id, lid=logical_id.lower())


def policies(template: dict) -> Iterator[FoundPolicy]:
    """Every policy document in ``template`` (identity, resource and trust policies)."""
    resources = template["Resources"]
    where_kind = {
        "AWS::IAM::Policy": [("PolicyDocument", "identity")],
        "AWS::IAM::ManagedPolicy": [("PolicyDocument", "identity")],
        "AWS::IAM::Role": [("AssumeRolePolicyDocument", "trust")],
        "AWS::SQS::QueuePolicy": [("PolicyDocument", "resource")],
        "AWS::SNS::TopicPolicy": [("PolicyDocument", "resource")],
        "AWS::S3::BucketPolicy": [("PolicyDocument", "resource")],
        "AWS::KMS::Key": [("KeyPolicy", "resource")],
        "AWS::EFS::FileSystem": [("FileSystemPolicy", "resource")],
    }
    for logical_id, resource in resources.items():
        props = resource.get("Properties", {})
        for prop, kind in where_kind.get(resource["Type"], []):
            if prop in props:
                yield FoundPolicy(f"{logical_id}.{prop}", kind, _resolve(props[prop], resources))
        if resource["Type"] == "AWS::IAM::Role":
            for inline in props.get("Policies", []):
                yield FoundPolicy(f"{logical_id}.Policies.{inline['PolicyName']}", "identity",
                                  _resolve(inline["PolicyDocument"], resources))


def import_parliament() -> types.ModuleType:
    """parliament 1.6.4 reads its data files with ``pkg_resources``, which setuptools no
    longer ships; a two-line stand-in gives it the same paths through importlib."""
    if "pkg_resources" not in sys.modules:
        try:
            import pkg_resources  # noqa: F401
        except ImportError:
            shim = types.ModuleType("pkg_resources")
            shim.resource_filename = (  # type: ignore[attr-defined]
                lambda package, name: str(importlib.resources.files(package) / name))
            sys.modules["pkg_resources"] = shim
    import parliament

    return parliament


def findings(policy: FoundPolicy) -> list[tuple[str, str]]:
    """parliament's findings for ``policy`` as (issue, detail) pairs."""
    parliament = import_parliament()
    result = parliament.analyze_policy_string(json.dumps(policy.document))
    return [(f.issue, json.dumps(f.detail, sort_keys=True, default=str)) for f in result.findings]


@dataclass(frozen=True)
class Accepted:
    """A parliament finding we keep, and why it is valid IAM (with the AWS page showing it).

    ``where`` and ``detail`` are regular expressions over ``FoundPolicy.where`` (logical id
    and property) and the finding's detail; ``kind`` limits it to one kind of policy."""

    issue: str
    kind: str
    where: str
    detail: str
    reason: str

    def covers(self, policy: FoundPolicy, issue: str, detail: str) -> bool:
        return (issue == self.issue and policy.kind == self.kind
                and re.search(self.where, policy.where) is not None
                and re.search(self.detail, detail) is not None)


#: Every parliament finding the project keeps, in one place, each with its reason.
ACCEPTED: tuple[Accepted, ...] = (
    Accepted(
        "MALFORMED", "trust", r"\.AssumeRolePolicyDocument$", "neither Resource nor NotResource",
        "A role trust policy names who may assume the role (Principal), never a Resource: the "
        "role is the resource. parliament checks identity policies, which need one. AWS's "
        "trust policies have none: https://docs.aws.amazon.com/IAM/latest/UserGuide/"
        "id_roles_terms-and-concepts.html (\"trust policy\") and the examples in "
        "https://docs.aws.amazon.com/IAM/latest/UserGuide/id_roles_create_for-service.html"),
    Accepted(
        "MALFORMED", "resource", r"FileSystem[0-9A-F]+\.FileSystemPolicy$",
        "neither Resource nor NotResource",
        "An EFS file-system policy applies to its own file system; AWS's file-system policy "
        "examples (the default policy too) carry no Resource: "
        "https://docs.aws.amazon.com/efs/latest/ug/iam-access-control-nfs-efs.html"),
    Accepted(
        "RESOURCE_STAR", "resource", r"Key[0-9A-F]+\.KeyPolicy$", "kms:",
        "In a KMS key policy Resource is \"*\", which means this key and no other: "
        "https://docs.aws.amazon.com/kms/latest/developerguide/key-policy-overview.html"),
    Accepted(
        "UNKNOWN_CONDITION_FOR_ACTION", "identity", r"^EmrClusterInstanceRoleDefaultPolicy",
        r"elasticmapreduce:ResourceTag/dl-cluster:id for action "
        r"elasticmapreduce:(DescribeCluster|ListInstances)",
        "Valid: the Service Authorization Reference lists elasticmapreduce:ResourceTag/"
        "${TagKey} (and aws:ResourceTag/${TagKey}) for the cluster resource type, which both "
        "actions require (https://docs.aws.amazon.com/service-authorization/latest/reference/"
        "list_amazonelasticmapreduce.html); EMR's own tag-based examples use this key "
        "(https://docs.aws.amazon.com/emr/latest/ManagementGuide/"
        "emr-fine-grained-cluster-access.html). parliament 1.6.4 looks only at the condition "
        "keys of an action's own row, not at its resource type's (its bundled database "
        "lists the key on the cluster resource)."),
    Accepted(
        "RESOURCE_MISMATCH", "identity",
        r"OperatorAccess(Policy|AdminSessionPolicy)[0-9A-F]+\.PolicyDocument$",
        r'"action": "ssm:SendCommand", "required_format": "arn:\*:ssm:\*:\*:document/\*"',
        "Valid: ssm:SendCommand authorizes the document AND each target instance "
        "(https://docs.aws.amazon.com/service-authorization/latest/reference/"
        "list_awssystemsmanager.html), so dlc's operator policy allows the caller's own "
        "per-user Command document (the admin policy the any-user one) in one statement and "
        "instances tagged dl-cluster:id=<cluster> "
        "in another (a tag condition cannot apply to the untagged document), as AWS's "
        "tag-restricted Run Command example does (https://docs.aws.amazon.com/"
        "systems-manager/latest/userguide/sysman-rc-setting-up-cmdsec.html). parliament "
        "1.6.4 wants a document ARN in every SendCommand statement."),
    Accepted(
        "RESOURCE_MISMATCH", "identity", r"JobRoleDefaultPolicy[0-9A-F]+\.PolicyDocument$",
        r'"action": "s3:(AbortMultipartUpload|GetObject|PutObject)", '
        r'"required_format": "arn:\*:s3:::\*/\*"',
        "Valid: the job role's checkpoint objects are arn:aws:s3:::<bucket>/checkpoints/"
        "<cluster>/${aws:PrincipalTag/dl-user}/*, an object ARN with an IAM policy variable "
        "(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html, "
        "\"Tags as policy variables\"), so each user's jobs reach only their own prefix. "
        "parliament 1.6.4 matches the ARN before substituting variables and does not see the "
        "object part."),
    Accepted(
        "RESOURCE_MISMATCH", "identity", r"OperatorAccessPolicy[0-9A-F]+\.PolicyDocument$",
        r'"action": "s3:(AbortMultipartUpload|PutObject)", '
        r'"required_format": "arn:\*:s3:::\*/\*"',
        "Valid: operators stage --workdir directories under arn:aws:s3:::<staging bucket>/"
        "workdirs/${aws:PrincipalTag/dl-user}/*, an object ARN with an IAM policy variable "
        "(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html, "
        "\"Tags as policy variables\"), so each operator writes under their own user's prefix "
        "only. parliament 1.6.4 matches the ARN before substituting variables and does not see "
        "the object part."),
    Accepted(
        "UNKNOWN_CONDITION_FOR_ACTION", "identity",
        r"OperatorAccess(Policy|AdminSessionPolicy)[0-9A-F]+\.PolicyDocument$",
        r"ssm:SessionDocumentAccessCheck for action ssm:StartSession",
        "Valid: AWS documents ssm:SessionDocumentAccessCheck on ssm:StartSession as the "
        "condition that makes a StartSession naming no document check the default shell "
        "document against the policy (https://docs.aws.amazon.com/systems-manager/latest/"
        "userguide/getting-started-sessiondocumentaccesscheck.html); without it an "
        "operator allowed port forwarding only would still get a shell. parliament 1.6.4's "
        "database does not list the key."),
)


def unexplained(template: dict) -> tuple[list[str], set[Accepted]]:
    """parliament's findings over every policy of ``template`` that no ``ACCEPTED`` entry
    covers (as lines), and the entries that covered something."""
    left, used = [], set()
    for policy in policies(template):
        for issue, detail in findings(policy):
            match = [a for a in ACCEPTED if a.covers(policy, issue, detail)]
            if match:
                used.update(match)
            else:
                left.append(f"{policy.where} ({policy.kind}): {issue} {detail}")
    return left, used

"""Letting the EMR stack's deletion end: the managed security groups' cross references
revoked, a custom resource's Delete.

Why it exists: EMR adds rules to its managed security groups that name each other (the
primary's group admits the core nodes' and the service access group's, the core's admits the
primary's, the service access group sends to both:
https://docs.aws.amazon.com/emr/latest/ManagementGuide/emr-man-sec-groups.html). The stack
created the groups, not those rules, so CloudFormation deletes the cluster and then tries
to delete each group while another group's rule still names it: EC2 refuses with
``DependencyViolation`` ("resource sg-... has a dependent object") and the stack's deletion
fails with the groups left behind. AWS's guide says to remove the rules that reference the
groups first.

The EMR stack's ``Custom::EmrSecurityGroupRelease`` (its ``EmrSecurityGroupRelease``
construct) names the groups; the cluster depends on it and it on the groups, so
CloudFormation deletes it after the cluster (no node uses the groups any more) and before
the groups. Its Delete revokes, in each named group, every ingress and egress rule that
names a security group (a CIDR or prefix-list rule blocks no deletion and stays). Rules
the template declares itself (``AWS::EC2::SecurityGroupIngress``) are deleted by
CloudFormation before this resource (they depend on it). A group already gone is
skipped. Create and Update do nothing.

Permissions (granted by the construct): ``ec2:DescribeSecurityGroups`` (no resource-level
permissions) and ``ec2:RevokeSecurityGroupIngress`` / ``ec2:RevokeSecurityGroupEgress`` on
the named groups only.
"""

from __future__ import annotations

from typing import Any

try:  # imported as lambda_src.emr_security_groups (tests, installed package)
    from . import cfn_response
except ImportError:  # imported as emr_security_groups (Lambda: the asset root is on sys.path)
    import cfn_response  # type: ignore[no-redef]

RESOURCE_TYPE = "Custom::EmrSecurityGroupRelease"
#: EC2's answer for a group id that does not exist (any more).
GROUP_GONE = "InvalidGroup.NotFound"
#: EC2's answer for a rule that is not there (revoked meanwhile).
RULE_GONE = "InvalidPermission.NotFound"


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _groups(event: dict[str, Any]) -> list[str]:
    ids = (event.get("ResourceProperties") or {}).get("SecurityGroupIds") or []
    if not isinstance(ids, list) or not ids or not all(
            isinstance(i, str) and i.startswith("sg-") for i in ids):
        raise ValueError(f"ResourceProperties.SecurityGroupIds must be a list of group ids, "
                         f"got {ids!r}")
    return ids


def group_references(permission: dict[str, Any]) -> dict[str, Any] | None:
    """``permission`` reduced to its security-group references (what RevokeSecurityGroup*
    takes back), or None when it names no group."""
    pairs = [{"GroupId": p["GroupId"], **({"UserId": p["UserId"]} if p.get("UserId") else {})}
             for p in permission.get("UserIdGroupPairs") or [] if p.get("GroupId")]
    if not pairs:
        return None
    out: dict[str, Any] = {"IpProtocol": permission["IpProtocol"], "UserIdGroupPairs": pairs}
    for key in ("FromPort", "ToPort"):
        if key in permission:
            out[key] = permission[key]
    return out


def _describe(ec2: Any, group_id: str) -> dict[str, Any] | None:
    try:
        (group,) = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    except Exception as exc:
        if _code(exc) == GROUP_GONE:
            return None
        raise
    return dict(group)


def release(ec2: Any, group_ids: list[str]) -> list[str]:
    """Revoke every rule of ``group_ids`` that names a security group; what was revoked, as
    ``<group> ingress|egress <protocol> <ports> <- -> <groups>`` lines."""
    revoked: list[str] = []
    for group_id in group_ids:
        group = _describe(ec2, group_id)
        if group is None:
            continue
        for direction, key, call in (("ingress", "IpPermissions",
                                      ec2.revoke_security_group_ingress),
                                     ("egress", "IpPermissionsEgress",
                                      ec2.revoke_security_group_egress)):
            for permission in group.get(key) or []:
                rule = group_references(permission)
                if rule is None:
                    continue
                try:
                    call(GroupId=group_id, IpPermissions=[rule])
                except Exception as exc:
                    if _code(exc) not in (RULE_GONE, GROUP_GONE):
                        raise
                    continue
                ports = f"{rule.get('FromPort', 'all')}-{rule.get('ToPort', 'all')}"
                names = ",".join(p["GroupId"] for p in rule["UserIdGroupPairs"])
                revoked.append(f"{group_id} {direction} {rule['IpProtocol']} {ports} {names}")
    return revoked


def respond(event: dict[str, Any], ec2: Any) -> dict[str, Any]:
    """The response object for one request (its calls made); never raises."""
    kind = event.get("RequestType")
    try:
        ids = _groups(event)
        if kind == "Delete":
            revoked = release(ec2, ids)
            return cfn_response.body(event, reason=f"revoked {len(revoked)} rule(s) naming "
                                     f"security groups: {'; '.join(revoked)}")
        if kind not in ("Create", "Update"):
            raise ValueError(f"unknown RequestType {kind!r}")
        return cfn_response.body(event)
    except Exception as exc:  # answered, never raised: CloudFormation would wait an hour
        return cfn_response.body(event, "FAILED",
                                 f"{RESOURCE_TYPE} {kind}: {type(exc).__name__}: {exc}")

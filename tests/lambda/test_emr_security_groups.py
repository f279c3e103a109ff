"""``Custom::EmrSecurityGroupRelease``: the EMR stack's deletion ends because its Delete
revokes the rules by which EMR's managed security groups name each other (EC2 refuses to
delete a group another group's rule names: DependencyViolation); CIDR rules stay, a group
or rule already gone is fine, Create and Update touch nothing. Real boto3 against moto's
EC2 (which, kinder than EC2, deletes a referenced group: the tests assert the state EC2
needs, no rule naming a group, and then the deletion)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from lambda_src import custom_resources, emr_security_groups, emr_teardown

REGION = "us-east-1"


@pytest.fixture()
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", REGION)):
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


class Clients:
    def __init__(self, ec2: Any) -> None:
        self.ec2 = ec2


def request(kind: str, ids: list[str]) -> dict[str, Any]:
    event = {"RequestType": kind, "ResponseURL": "unused", "RequestId": "r",
             "StackId": f"arn:aws:cloudformation:{REGION}:123456789012:stack/DLEmr/1",
             "LogicalResourceId": "EmrClusterSecurityGroupRelease",
             "ResourceType": emr_security_groups.RESOURCE_TYPE,
             "ResourceProperties": {"ServiceToken": "arn:fn", "SecurityGroupIds": ids}}
    if kind != "Create":
        event["PhysicalResourceId"] = "EmrClusterSecurityGroupRelease-emrsecuritygrouprelease"
    return event


def emr_managed_groups(ec2: Any) -> dict[str, str]:
    """The three groups with the rules EMR adds to them (the guide's default rules)."""
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    ids = {name: ec2.create_security_group(GroupName=name, Description=name,
                                           VpcId=vpc)["GroupId"]
           for name in ("primary", "core", "service")}
    primary, core, service = ids["primary"], ids["core"], ids["service"]

    def all_from(group: str, *sources: str) -> None:
        for protocol, ports in (("tcp", (0, 65535)), ("udp", (0, 65535)), ("icmp", (-1, -1))):
            ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[{
                "IpProtocol": protocol, "FromPort": ports[0], "ToPort": ports[1],
                "UserIdGroupPairs": [{"GroupId": s} for s in sources]}])

    all_from(primary, primary, core)
    all_from(core, primary, core)
    for group in (primary, core):
        ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[{
            "IpProtocol": "tcp", "FromPort": 8443, "ToPort": 8443,
            "UserIdGroupPairs": [{"GroupId": service}]}])
    ec2.authorize_security_group_egress(GroupId=service, IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 8443, "ToPort": 8443,
        "UserIdGroupPairs": [{"GroupId": primary}, {"GroupId": core}]}])
    ec2.authorize_security_group_ingress(GroupId=service, IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 9443, "ToPort": 9443,
        "UserIdGroupPairs": [{"GroupId": primary}]}])
    # a CIDR rule blocks no deletion: it stays
    ec2.authorize_security_group_ingress(GroupId=primary, IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
        "IpRanges": [{"CidrIp": "10.0.0.0/16"}]}])
    return ids


def naming_groups(ec2: Any, ids: list[str]) -> list[tuple[str, str]]:
    out = []
    for group in ec2.describe_security_groups(GroupIds=ids)["SecurityGroups"]:
        for key in ("IpPermissions", "IpPermissionsEgress"):
            out += [(group["GroupId"], p["GroupId"]) for perm in group[key]
                    for p in perm.get("UserIdGroupPairs") or []]
    return out


def test_delete_revokes_every_rule_naming_a_group_and_the_groups_can_go(ec2: Any) -> None:
    ids = list(emr_managed_groups(ec2).values())
    assert len(naming_groups(ec2, ids)) > 6
    answer = custom_resources.respond(request("Delete", ids), Clients(ec2))
    assert answer["Status"] == "SUCCESS", answer
    assert "revoked 10 rule(s)" in answer["Reason"], answer["Reason"]
    assert naming_groups(ec2, ids) == []
    (primary,) = ec2.describe_security_groups(GroupIds=ids[:1])["SecurityGroups"]
    assert [r["CidrIp"] for p in primary["IpPermissions"] for r in p["IpRanges"]] == [
        "10.0.0.0/16"]
    for group in ids:  # what CloudFormation does next
        ec2.delete_security_group(GroupId=group)
    # deleted again (a retried Delete) with the groups gone: done
    assert custom_resources.respond(request("Delete", ids), Clients(ec2))["Status"] == \
        "SUCCESS"


def test_create_and_update_touch_nothing(ec2: Any) -> None:
    ids = list(emr_managed_groups(ec2).values())
    before = naming_groups(ec2, ids)
    for kind in ("Create", "Update"):
        assert custom_resources.respond(request(kind, ids), Clients(ec2))["Status"] == \
            "SUCCESS"
    assert naming_groups(ec2, ids) == before


def test_a_refused_revoke_fails_the_delete_naming_it(ec2: Any) -> None:
    ids = list(emr_managed_groups(ec2).values())

    class Refusing:
        def __getattr__(self, name: str) -> Any:
            return getattr(ec2, name)

        def revoke_security_group_ingress(self, **_: Any) -> None:
            from botocore.exceptions import ClientError
            raise ClientError({"Error": {"Code": "UnauthorizedOperation",
                                         "Message": "not allowed"}},
                              "RevokeSecurityGroupIngress")

    answer = custom_resources.respond(request("Delete", ids), Clients(Refusing()))
    assert answer["Status"] == "FAILED"
    assert "UnauthorizedOperation" in answer["Reason"]
    assert emr_security_groups.RESOURCE_TYPE in answer["Reason"]


def test_bad_properties_fail_naming_them(ec2: Any) -> None:
    answer = custom_resources.respond(request("Delete", ["not-a-group"]), Clients(ec2))
    assert answer["Status"] == "FAILED" and "SecurityGroupIds" in answer["Reason"]


def test_the_functions_handler_answers_on_the_response_url(
        ec2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = list(emr_managed_groups(ec2).values())
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(custom_resources.cfn_response, "send",
                        lambda url, body: sent.append((url, body)))
    event = {**request("Delete", ids), "ResponseURL": "https://cfn.example/r"}
    answer = emr_teardown.handler(event, None)
    assert answer["Status"] == "SUCCESS"
    assert sent == [("https://cfn.example/r", answer)]
    assert naming_groups(ec2, ids) == []

"""``Custom::ServiceRoleGrant``: the grant that lets Auto Scaling's service-linked role use
the topic's key is retried while KMS does not see the new role yet (a bounded time, then an
error naming the role), made and revoked for real against the emulator's KMS, and answered
through the capacity adjuster's dispatcher."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from lambda_src import custom_resources, service_role_grant
from tests.conftest import REGION

ACCOUNT = "123456789012"
ROLE = (f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/autoscaling.amazonaws.com/"
        "AWSServiceRoleForAutoScaling")


def request(kind: str, key: str, physical: str = "") -> dict[str, Any]:
    event: dict[str, Any] = {
        "RequestType": kind, "ResponseURL": "unused", "RequestId": "r",
        "StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/DLClusterStack/1",
        "LogicalResourceId": "AutoScalingMayUseTheKey",
        "ResourceType": service_role_grant.RESOURCE_TYPE,
        "ResourceProperties": {"ServiceToken": "arn:fn", "KeyArn": key,
                               "GranteePrincipal": ROLE, "GrantName": "DLClusterGrant",
                               "Operations": ["GenerateDataKey", "Decrypt"]}}
    if physical:
        event["PhysicalResourceId"] = physical
    return event


def refusal(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} from the fake KMS"}},
                       "CreateGrant")


class RefusingKms:
    """Answers CreateGrant with ``code`` ``refusals`` times (None: for ever), then a grant."""

    def __init__(self, refusals: int | None, code: str = "InvalidArnException") -> None:
        self.refusals, self.code, self.calls = refusals, code, 0

    def create_grant(self, **params: Any) -> dict[str, str]:
        self.calls += 1
        assert params["GranteePrincipal"] == ROLE
        if self.refusals is None or self.calls <= self.refusals:
            raise refusal(self.code)
        return {"GrantId": "grant-1", "GrantToken": "token"}


class Clock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


@pytest.mark.parametrize("code", sorted(service_role_grant.NOT_YET_VISIBLE))
def test_a_role_kms_does_not_see_yet_is_retried_until_it_does(code: str) -> None:
    kms, clock = RefusingKms(3, code), Clock()
    answer = service_role_grant.respond(request("Create", "arn:key"), kms,
                                        sleep=clock.sleep, clock=clock)
    assert answer["Status"] == "SUCCESS", answer
    assert answer["PhysicalResourceId"] == "grant-1"
    assert kms.calls == 4
    assert clock.pauses == [1.0, 2.0, 4.0]  # doubling


def test_a_role_never_seen_fails_within_the_bound_naming_the_role() -> None:
    kms, clock = RefusingKms(None), Clock()
    answer = service_role_grant.respond(request("Create", "arn:key"), kms,
                                        sleep=clock.sleep, clock=clock)
    assert answer["Status"] == "FAILED"
    reason = answer["Reason"]
    assert "RoleNotVisible" in reason and ROLE in reason
    assert "aws iam get-role --role-name AWSServiceRoleForAutoScaling" in reason
    assert "InvalidArnException" in reason
    assert clock.now <= service_role_grant.DEADLINE_SECONDS
    assert kms.calls == len(clock.pauses) + 1 > 3
    assert max(clock.pauses) == service_role_grant.MAX_PAUSE_SECONDS


def test_another_error_fails_at_once() -> None:
    kms, clock = RefusingKms(None, "AccessDeniedException"), Clock()
    answer = service_role_grant.respond(request("Create", "arn:key"), kms,
                                        sleep=clock.sleep, clock=clock)
    assert answer["Status"] == "FAILED" and "AccessDeniedException" in answer["Reason"]
    assert kms.calls == 1 and clock.pauses == []


@pytest.fixture()
def kms(moto_reset: str) -> Any:
    return boto3.client("kms", endpoint_url=moto_reset, region_name=REGION)


class Clients:
    def __init__(self, kms: Any) -> None:
        self.kms = kms


def test_the_grant_is_made_once_and_revoked_on_delete(kms: Any) -> None:
    key = kms.create_key(Description="topic key")["KeyMetadata"]["Arn"]
    answer = custom_resources.respond(request("Create", key), Clients(kms))
    assert answer["Status"] == "SUCCESS", answer
    grant_id = answer["PhysicalResourceId"]
    (grant,) = kms.list_grants(KeyId=key)["Grants"]
    assert (grant["GrantId"], grant["GranteePrincipal"]) == (grant_id, ROLE)
    assert sorted(grant["Operations"]) == ["Decrypt", "GenerateDataKey"]
    # named: KMS returns the same grant to a repeated call with the same name and
    # parameters (CreateGrant's Name), so Lambda's retry of an invocation makes none more
    # (moto makes a new one each time, so that half is AWS's documented word, not tested)
    assert grant["Name"] == "DLClusterGrant"
    deleted = custom_resources.respond(request("Delete", key, grant_id), Clients(kms))
    assert deleted["Status"] == "SUCCESS", deleted
    assert kms.list_grants(KeyId=key)["Grants"] == []
    # a second Delete (the grant gone) and a failed Create's rollback (no grant) are fine
    assert custom_resources.respond(request("Delete", key, grant_id),
                                    Clients(kms))["Status"] == "SUCCESS"
    assert custom_resources.respond(
        request("Delete", key, "AutoScalingMayUseTheKey-servicerolegrant"),
        Clients(kms))["Status"] == "SUCCESS"

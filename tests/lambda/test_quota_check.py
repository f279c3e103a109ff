"""The stack's ``Custom::QuotaCheck`` answered against the emulator's Service Quotas (a new
account's values): a need above a quota (On-Demand or Spot) answers FAILED naming the
quota, its value, the need and the request command; an increase lets it through."""

from __future__ import annotations

import boto3
import pytest

from lambda_src import custom_resources, quota_check
from tests.conftest import REGION

STACK = f"arn:aws:cloudformation:{REGION}:123456789012:stack/DLClusterStack/1"


def request(*nodes: tuple[str, str, int, bool], kind: str = "Create") -> dict:
    return {"RequestType": kind, "ResponseURL": "unused", "StackId": STACK, "RequestId": "r",
            "LogicalResourceId": "QuotaCheck", "ResourceType": quota_check.RESOURCE_TYPE,
            "ResourceProperties": {"Nodes": [
                {"Key": k, "InstanceType": t, "Count": str(c), "Spot": str(s).lower()}
                for k, t, c, s in nodes]}}


class Clients:
    def __init__(self, endpoint: str) -> None:
        self.ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION)
        self.service_quotas = boto3.client("service-quotas", endpoint_url=endpoint,
                                           region_name=REGION)
        self.autoscaling = None


@pytest.fixture()
def clients(moto_reset: str) -> Clients:
    return Clients(moto_reset)


G5 = (("masterInstanceType", "g5.xlarge", 1, False), ("workerInstanceType", "g5.xlarge", 2,
                                                      False))


def test_a_new_accounts_g_quota_refuses_the_nodes(clients: Clients) -> None:
    answer = custom_resources.respond(request(*G5), clients)
    assert answer["Status"] == "FAILED"
    reason = answer["Reason"]
    assert "need 12 vCPUs of 'Running On-Demand G and VT instances' (L-DB2E81BA)" in reason
    assert "the quota in us-east-1 is 0" in reason
    assert ("aws service-quotas request-service-quota-increase --service-code ec2 "
            "--quota-code L-DB2E81BA --desired-value 12 --region us-east-1") in reason
    assert "'masterInstanceType', 'workerInstanceType'" in reason


def test_an_increase_lets_the_nodes_through_and_spot_is_checked_apart(
        clients: Clients) -> None:
    clients.service_quotas.request_service_quota_increase(
        ServiceCode="ec2", QuotaCode="L-DB2E81BA", DesiredValue=12)
    assert custom_resources.respond(request(*G5), clients)["Status"] == "SUCCESS"
    spot = custom_resources.respond(
        request(*G5, ("spotWorkers", "g5.xlarge", 1, True)), clients)
    assert spot["Status"] == "FAILED"
    assert "'Spot G and VT instances' (L-3819A6DF)" in spot["Reason"]
    assert "L-DB2E81BA" not in spot["Reason"]  # the On-Demand need fits now


def test_update_checks_again_and_delete_checks_nothing(clients: Clients) -> None:
    assert custom_resources.respond(request(*G5, kind="Update"), clients)["Status"] == "FAILED"
    assert custom_resources.respond(request(*G5, kind="Delete"), clients)["Status"] == \
        "SUCCESS"


def test_a_malformed_request_answers_failed() -> None:
    event = request(*G5)
    event["ResourceProperties"]["Nodes"] = [{"Key": "x"}]
    answer = quota_check.respond(event, None, None)
    assert answer["Status"] == "FAILED" and "needs Key, InstanceType, Count" in answer["Reason"]
    event["ResourceType"] = "Custom::Other"
    assert "answers no 'Custom::Other'" in custom_resources.respond(event, None)["Reason"]


class DeniedQuotas:
    """Service Quotas behind an organization's deny: every call AccessDenied."""

    def get_service_quota(self, **kwargs):
        from botocore.exceptions import ClientError

        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}},
                          "GetServiceQuota")

    def get_paginator(self, name):
        return self

    def paginate(self, **kwargs):
        self.get_service_quota()


def test_a_quota_it_cannot_read_is_said_not_refused(clients: Clients) -> None:
    answer = quota_check.respond(request(*G5), clients.ec2, DeniedQuotas())
    assert answer["Status"] == "SUCCESS"
    assert "not checked: Running On-Demand G and VT instances (L-DB2E81BA)" in answer["Reason"]

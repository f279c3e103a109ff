"""``dlc status``'s line on the cluster's cost allocation tag: whether Budgets and Cost
Explorer count the cluster's costs under ``dl-cluster:id`` (a user-defined tag counts only
once activated in Billing), asked of Cost Explorer over HTTP (the emulator's moto, which
lists a used key ``Inactive`` as a new account does, until it is activated)."""

from __future__ import annotations

import boto3

from dlc import aws, cost
from dlc.target import Target

KEY = aws.CLUSTER_TAG_KEY


def test_unseen_then_inactive_then_active_as_billing_says(moto_reset: str) -> None:
    target = Target(region="eu-west-1", endpoint=moto_reset,
                    credentials={"access_key_id": "AK", "secret_access_key": "SK"})
    assert aws.cost_tag_status(target, KEY) == ""  # no resource carries it yet
    ec2 = boto3.client("ec2", endpoint_url=moto_reset, region_name="eu-west-1")
    ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": KEY, "Value": "c1"}]}])
    assert aws.cost_tag_status(target, KEY) == "Inactive"
    ce = boto3.client("ce", endpoint_url=moto_reset, region_name="us-east-1")
    res = ce.update_cost_allocation_tags_status(CostAllocationTagsStatus=[
        {"TagKey": KEY, "Status": "Active"}, {"TagKey": "never-used", "Status": "Active"}])
    assert [e["TagKey"] for e in res["Errors"]] == ["never-used"]
    assert aws.cost_tag_status(target, KEY) == "Active"


def test_the_line_says_whether_costs_count_and_the_command_that_makes_them():
    inactive = cost.tag_line(KEY, "Inactive")
    assert "NOT active" in inactive and f"TagKey={KEY},Status=Active" in inactive
    assert "24 h" in cost.tag_line(KEY, "")
    assert cost.tag_line(KEY, "Active").startswith(f"cost tag {KEY}: active")
    assert "AccessDenied" in cost.tag_line(KEY, None, "ce ListCostAllocationTags failed: "
                                                      "AccessDenied: no")

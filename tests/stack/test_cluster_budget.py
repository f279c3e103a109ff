"""The cluster's daily budget (``budgetPerDay``: constructs_lib/cluster_budget.py), which
notifies the cluster's one alarm topic (``ClusterObservability``'s), and the master's price
permissions."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from constructs_lib.validation import ConfigError
from tests.stack.iam_lint import unexplained
from tests.stack.synth import cluster_template


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template(budgetPerDay="250.5")


@pytest.fixture(scope="module")
def plain() -> Template:
    return cluster_template()


def test_off_by_default(plain: Template) -> None:
    assert not plain.find_resources("AWS::Budgets::Budget")
    # and without a budget, nothing but CloudWatch publishes to the alarm topic
    assert "budgets.amazonaws.com" not in str(plain.find_resources("AWS::SNS::TopicPolicy"))


def test_a_daily_cost_budget_of_the_clusters_tag_notifies_the_alarm_topic(
        template: Template) -> None:
    (budget,) = template.find_resources("AWS::Budgets::Budget").values()
    data = budget["Properties"]["Budget"]
    assert (data["BudgetType"], data["TimeUnit"], data["BudgetLimit"]) == (
        "COST", "DAILY", {"Amount": 250.5, "Unit": "USD"})
    # the tag the node groups carry and propagate to their instances
    group_tags = {(t["Key"], t["Value"], t["PropagateAtLaunch"])
                  for g in template.find_resources("AWS::AutoScaling::AutoScalingGroup").values()
                  for t in g["Properties"]["Tags"] if t["Key"] == "dl-cluster:id"}
    ((_key, cluster_id, propagated),) = group_tags
    assert propagated is True
    assert data["CostFilters"] == {"TagKeyValue": [f"user:dl-cluster:id${cluster_id}"]}
    topic_id = template.to_json()["Outputs"]["AlarmTopicArn"]["Value"]["Ref"]
    notes = budget["Properties"]["NotificationsWithSubscribers"]
    assert sorted(n["Notification"]["Threshold"] for n in notes) == [80, 100]
    for n in notes:
        assert n["Notification"]["NotificationType"] == "ACTUAL"
        assert n["Subscribers"] == [{"SubscriptionType": "SNS", "Address": {"Ref": topic_id}}]
    # created once the topic lets Budgets publish (its policy and its key's)
    policies = set(template.find_resources("AWS::SNS::TopicPolicy"))
    assert topic_id in budget["DependsOn"] and policies & set(budget["DependsOn"])


def test_the_alarm_topic_is_encrypted_and_lets_only_budgets_of_this_account_in(
        template: Template) -> None:
    resources = template.to_json()["Resources"]
    topic_id = template.to_json()["Outputs"]["AlarmTopicArn"]["Value"]["Ref"]
    key_id = resources[topic_id]["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = resources[key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    (budgets_on_key,) = [s for s in key["KeyPolicy"]["Statement"]
                         if s.get("Principal") == {"Service": "budgets.amazonaws.com"}]
    assert set(budgets_on_key["Action"]) == {"kms:GenerateDataKey*", "kms:Decrypt"}
    # AWS's published example for a service publishing to an encrypted topic: no
    # kms:ViaService (the service is the caller), this account only
    assert budgets_on_key["Condition"] == {"StringEquals": {
        "aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    (policy,) = [p for p in template.find_resources("AWS::SNS::TopicPolicy").values()
                 if p["Properties"]["Topics"] == [{"Ref": topic_id}]]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (publish,) = [s for s in statements if s.get("Principal") == {
        "Service": "budgets.amazonaws.com"}]
    assert publish["Action"] == "sns:Publish" and publish["Effect"] == "Allow"
    assert "aws:SourceAccount" in publish["Condition"]["StringEquals"]
    assert any(s["Effect"] == "Deny" and "aws:SecureTransport" in str(s) for s in statements)


def test_parliament_finds_nothing_new_in_the_budgets_policies(template: Template) -> None:
    left, _used = unexplained(template.to_json())
    assert not left, "\n".join(left)


def test_the_master_may_read_prices_and_nothing_more(plain: Template) -> None:
    found = [s for p in plain.find_resources("AWS::IAM::Policy").values()
             for s in p["Properties"]["PolicyDocument"]["Statement"]
             if s.get("Sid") == "PricesOfJobNodes"]
    (statement,) = found  # the master's role only
    assert sorted(statement["Action"]) == ["ec2:DescribeSpotPriceHistory",
                                           "pricing:GetProducts"]
    assert statement["Effect"] == "Allow" and statement["Resource"] == "*"


@pytest.mark.parametrize("value", ["0", "-3", "lots", "1.001", "2000000"])
def test_a_bad_budget_is_refused_at_synth_naming_it(value: str) -> None:
    with pytest.raises(ConfigError, match="budgetPerDay") as err:
        cluster_template(budgetPerDay=value)
    assert repr(value) in str(err.value)


def test_the_cost_tag_reaches_the_nodes_volumes_too(template: Template) -> None:
    """The budget filters on the cluster's tag; an Auto Scaling group's tags reach its
    instances only, so the nodes' EBS volumes carry it through the launch templates' tag
    specifications, or their cost is outside the budget."""
    (cluster_id,) = {t["Value"] for g in template.find_resources(
        "AWS::AutoScaling::AutoScalingGroup").values()
        for t in g["Properties"]["Tags"] if t["Key"] == "dl-cluster:id"}
    for lt in template.find_resources("AWS::EC2::LaunchTemplate").values():
        specs = {s["ResourceType"]: {t["Key"]: t["Value"] for t in s["Tags"]}
                 for s in lt["Properties"]["LaunchTemplateData"].get("TagSpecifications", [])}
        assert specs.get("volume", {}).get("dl-cluster:id") == cluster_id, specs


def test_every_cost_line_of_the_cluster_carries_its_tag(template: Template) -> None:
    """A cost counts under ``dl-cluster:id`` only if what incurs it is tagged: the file
    system, the NAT gateways and their addresses, the checkpoint bucket, the log groups
    (Budgets and Cost Explorer would miss them otherwise). The stack's one AwsCustomResource
    provider (a singleton of the stack, not of the cluster) keeps its own log group untagged."""
    from constructs_lib.cost_tags import COST_BEARING_TYPES

    (cluster_id,) = {t["Value"] for g in template.find_resources(
        "AWS::AutoScaling::AutoScalingGroup").values()
        for t in g["Properties"]["Tags"] if t["Key"] == "dl-cluster:id"}
    resources = template.to_json()["Resources"]

    def tags(r: dict) -> dict:
        raw = r.get("Properties", {}).get("Tags") or r.get("Properties", {}).get(
            "FileSystemTags") or []
        return {t["Key"]: t["Value"] for t in raw} if isinstance(raw, list) else raw

    seen = {r["Type"] for r in resources.values() if r["Type"] in COST_BEARING_TYPES}
    assert {"AWS::EFS::FileSystem", "AWS::EC2::NatGateway", "AWS::S3::Bucket"} <= seen, seen
    for name, r in resources.items():
        if r["Type"] in COST_BEARING_TYPES and name.startswith("Cluster"):
            assert tags(r).get("dl-cluster:id") == cluster_id, (name, r["Type"])

"""ClusterBudget: an AWS Budgets cost budget per day for one cluster, alarming on a topic.

The budget counts the costs tagged ``dl-cluster:id=<cluster id>``: the tag every node's Auto
Scaling group carries and propagates to its instances. AWS Budgets filters on a tag only once
it is activated as a cost allocation tag in the payer account's Billing console (or with Cost
Explorer's ``UpdateCostAllocationTagsStatus``), and sees tagged costs from then on, with the
billing data's delay of hours
(https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/activating-tags.html).
Budgets notifies the topic when the day's actual cost passes 80 % and 100 % of the limit
(https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-budgets-budget.html).

It is a cluster-wide alarm, not a brake: jobs are stopped by their own ``--max-cost``
(the job controller's ledger, docs/runner.md).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_sns as sns
from constructs import Construct

from constructs_lib import validation
from constructs_lib.alarm_topic import AlarmTopic
from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY

#: Percentages of the day's limit at which the topic hears of the actual cost.
DEFAULT_THRESHOLDS = (80, 100)
#: The largest daily limit accepted (a typo's extra zeros fail at synth).
MAX_USD_PER_DAY = Decimal("1000000")


def check_usd_per_day(name: str, value: object) -> float:
    """A daily limit in USD (> 0, at most cents), or ConfigError naming ``name`` and value."""
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise validation.ConfigError(f"{name} must be an amount in USD such as 250, got "
                                     f"{value!r}") from None
    if not amount.is_finite() or not 0 < amount <= MAX_USD_PER_DAY or \
            amount != amount.quantize(Decimal("0.01")):
        raise validation.ConfigError(f"{name} must be more than 0 and at most "
                                     f"{MAX_USD_PER_DAY} USD, in cents at most, got {value!r}")
    return float(amount)


class ClusterBudget(Construct):
    """A DAILY COST budget of the cluster's tagged costs with notifications on ``topic``."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_id: str,
                 usd_per_day: float, topic: sns.ITopic | None = None,
                 thresholds: tuple[int, ...] = DEFAULT_THRESHOLDS) -> None:
        """
        :param cluster_id: the cluster whose ``dl-cluster:id`` tag the budget filters on.
        :param usd_per_day: the day's limit in USD.
        :param topic: where Budgets notifies; it must let ``budgets.amazonaws.com`` publish
            (and use its key, if encrypted).
            :default: a new ``AlarmTopic`` (KMS-encrypted) that allows it
        :param thresholds: percentages of the limit that notify, on the actual cost.
            :default: 80 and 100
        """
        super().__init__(scope, construct_id)
        limit = check_usd_per_day("usd_per_day", usd_per_day)
        if not thresholds or any(not 0 < t <= 1000 for t in thresholds):
            raise validation.ConfigError(f"ClusterBudget {construct_id}: thresholds must be "
                                         f"percentages in (0, 1000], got {thresholds!r}")
        self.alarm_topic: AlarmTopic | None = None
        if topic is None:
            self.alarm_topic = AlarmTopic(self, "AlarmTopic", cluster_id=cluster_id)
            self.alarm_topic.allow_service("budgets.amazonaws.com")
            topic = self.alarm_topic.topic
        self.topic = topic
        self.budget = budgets.CfnBudget(
            self, "Budget",
            budget=budgets.CfnBudget.BudgetDataProperty(
                budget_name=f"{cluster_id}-per-day",
                budget_type="COST", time_unit="DAILY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=limit, unit="USD"),
                cost_filters={"TagKeyValue": [f"user:{CLUSTER_TAG_KEY}${cluster_id}"]}),
            notifications_with_subscribers=[
                budgets.CfnBudget.NotificationWithSubscribersProperty(
                    notification=budgets.CfnBudget.NotificationProperty(
                        notification_type="ACTUAL", comparison_operator="GREATER_THAN",
                        threshold=float(t), threshold_type="PERCENTAGE"),
                    subscribers=[budgets.CfnBudget.SubscriberProperty(
                        subscription_type="SNS", address=topic.topic_arn)])
                for t in thresholds])
        if self.alarm_topic is not None:  # the topic lets Budgets in before it is named
            self.budget.node.add_dependency(self.alarm_topic)

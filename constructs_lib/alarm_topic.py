"""AlarmTopic: a small KMS-encrypted SNS topic for the cluster's alarms (today: its budget),
and :func:`allow_publish`, the one rule by which an AWS service may publish to such a topic.

Operators subscribe to it (e-mail, chat, a pager) outside the stack. It is encrypted with a
key of its own (rotated) and accepts TLS only. ``enforce_ssl`` writes a topic policy, and a
topic policy replaces SNS's default one (which let the account's own principals publish),
so an AWS service publishes only if a statement names it: CloudWatch's alarm actions fail
with "not authorized to perform SNS:Publish" otherwise, and no alarm e-mail arrives. Each
service is allowed for this account only (``aws:SourceAccount``) and, where its source is
known, for its own resources only (``aws:SourceArn``: CloudWatch's alarms of this account
and region), on the topic and on the key, against the confused deputy
(https://docs.aws.amazon.com/sns/latest/dg/sns-access-policy-use-cases.html). The key
statement follows AWS's published example for services publishing to an encrypted topic
(``kms:GenerateDataKey*`` and ``kms:Decrypt``, no ``kms:ViaService``: the service, not an
IAM principal of the account, is the caller,
https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html#compatibility-with-aws-services,
https://docs.aws.amazon.com/cost-management/latest/userguide/budgets-sns-policy.html).
"""

from __future__ import annotations

from aws_cdk import Aws, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from constructs import Construct


class AlarmTopic(Construct):
    """An encrypted topic for alarms; ``topic`` and ``key`` are its parts."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_id: str) -> None:
        """
        :param cluster_id: the cluster the alarms are about (in the topic's display name).
        """
        super().__init__(scope, construct_id)
        self.key = kms.Key(
            self, "Key", enable_key_rotation=True, removal_policy=RemovalPolicy.DESTROY,
            description=f"Encrypts the alarm topic of cluster {cluster_id}")
        self.topic = sns.Topic(self, "Topic", master_key=self.key, enforce_ssl=True,
                               display_name=f"{cluster_id} alarms")

    def allow_service(self, service: str, *, source_arn: str | None = None) -> None:
        """Let AWS service principal ``service`` publish here (:func:`allow_publish`)."""
        allow_publish(self.topic, self.key, service, source_arn=source_arn)


def cloudwatch_alarms_arn() -> str:
    """Every CloudWatch alarm of this stack's account and region (``aws:SourceArn``)."""
    return f"arn:{Aws.PARTITION}:cloudwatch:{Aws.REGION}:{Aws.ACCOUNT_ID}:alarm:*"


def allow_publish(topic: sns.ITopic, key: kms.IKey, service: str, *,
                  source_arn: str | None = None) -> None:
    """Let AWS service principal ``service`` publish to ``topic`` and use its ``key`` for
    it: this account's only, and only for ``source_arn`` (a pattern) when given."""
    conditions: dict = {"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}
    if source_arn:
        conditions["ArnLike"] = {"aws:SourceArn": source_arn}
    principal = iam.ServicePrincipal(service)
    name = service.split(".")[0].title()
    topic.add_to_resource_policy(iam.PolicyStatement(
        sid=f"Publish{name}", actions=["sns:Publish"], principals=[principal],
        resources=[topic.topic_arn], conditions=conditions))
    key.add_to_resource_policy(iam.PolicyStatement(
        sid=f"Encrypt{name}Alarms", actions=["kms:GenerateDataKey*", "kms:Decrypt"],
        principals=[principal], resources=["*"], conditions=conditions))

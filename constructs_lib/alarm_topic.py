"""AlarmTopic: a small KMS-encrypted SNS topic for the cluster's alarms (today: its budget).

Operators subscribe to it (e-mail, chat, a pager) outside the stack. It is encrypted with a
key of its own (rotated), accepts TLS only, and AWS services publish to it only when
:meth:`AlarmTopic.allow_service` names them, for this account only (``aws:SourceAccount``),
with the key usable by that service for SNS alone. AWS Budgets needs both: the topic's
policy to allow ``budgets.amazonaws.com`` to publish and, on an encrypted topic, the key's
policy to let it ``kms:GenerateDataKey*`` and ``kms:Decrypt``
(https://docs.aws.amazon.com/cost-management/latest/userguide/budgets-sns-policy.html).
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

    def allow_service(self, service: str) -> None:
        """Let AWS service principal ``service`` publish here (this account's only)."""
        account = {"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}
        principal = iam.ServicePrincipal(service)
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid=f"Publish{service.split('.')[0].title()}", actions=["sns:Publish"],
            principals=[principal], resources=[self.topic.topic_arn], conditions=account))
        self.key.add_to_resource_policy(iam.PolicyStatement(
            sid=f"Encrypt{service.split('.')[0].title()}Alarms",
            actions=["kms:GenerateDataKey*", "kms:Decrypt"], principals=[principal],
            resources=["*"], conditions={"StringEquals": {
                "aws:SourceAccount": Aws.ACCOUNT_ID,
                "kms:ViaService": f"sns.{Aws.REGION}.amazonaws.com"}}))

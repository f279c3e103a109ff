"""SNS topic for Auto Scaling notifications + the Lambda that adjusts worker capacity."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, Aws, CfnWaitConditionHandle, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from constructs_lib.package_paths import ASSET_EXCLUDES, lambda_source_dir
from constructs_lib.service_linked_role import auto_scaling_service_linked_role
from constructs_lib.service_role_grant import ServiceRoleGrant
from constructs_lib.validation import ConfigError, reports_path

CLUSTER_TAG_KEY = "dl-cluster:id"
ROLE_TAG_KEY = "NodeType"
HANDLER = "capacity_adjuster.handler"
RUNTIME = lambda_.Runtime.PYTHON_3_14
#: How long the function's logs are kept.
DEFAULT_LOG_RETENTION = logs.RetentionDays.ONE_MONTH
#: The function's timeout.
DEFAULT_TIMEOUT = Duration.seconds(60)
#: Oldest notification Lambda still delivers to the function (throttled or retried events):
#: well inside the stack's 55-minute setup wait, so one that ages out reaches the failed-
#: invocations queue, and the master, while the stack still waits.
MAX_EVENT_AGE = Duration.minutes(30)
#: Retries of a failed invocation (Lambda's default and maximum).
RETRY_ATTEMPTS = 2
#: How long a transient launch error (no EC2 capacity, throttling) is left to the group's own
#: retries, counted from the group's creation, before the count is lowered or the groups
#: move: capacity often frees within minutes, and a lowered group stays lowered.
DEFAULT_LAUNCH_RETRY_SECONDS = 600
#: Longer is refused: the stack's setup wait (55 minutes by default) would end first.
MAX_LAUNCH_RETRY_SECONDS = 3300


class CapacityAdjuster(Construct):
    """Turns Auto Scaling notifications into cluster-setup messages; lowers worker capacity
    when launches fail so the cluster still comes up (docs/capacity-adjuster.md).

    The function recognises the cluster's groups by their ``dl-cluster:id`` tag, and its
    write permissions are conditioned on that tag. That keeps it least-privilege (it can
    change only this cluster's groups) without depending on the groups, which must be
    created AFTER the subscription so that their first launch notifications are delivered.

    The topic is encrypted with a customer-managed KMS key (rotation on), because Auto
    Scaling's service-linked role cannot publish to a topic encrypted with the AWS-managed SNS
    key, and its policy refuses clients without TLS; the same key encrypts the function's log
    group. The function runs Python 3.14 (the latest runtime).

    SNS invokes the function asynchronously: an invocation that still fails after Lambda's two
    retries, or that waits longer than 30 minutes, is sent as an invocation record to
    ``failed_invocations_queue`` (Lambda's on-failure destination) instead of being dropped;
    the master agent reads that queue while it waits for setup and fails the stack's wait
    condition naming the lost notification (docs/capacity-adjuster.md, "Lost notifications").
    """

    @reports_path
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_id: str,
        master_queue: sqs.IQueue,
        failed_invocations_queue: sqs.IQueue | None = None,
        log_retention: logs.RetentionDays = DEFAULT_LOG_RETENTION,
        timeout: Duration = DEFAULT_TIMEOUT,
        zone_choices: Sequence[tuple[str, str, str]] = (),
        max_zone_moves: int = 0,
        launch_retry_seconds: int = DEFAULT_LAUNCH_RETRY_SECONDS,
    ) -> None:
        """
        :param cluster_id: the ``dl-cluster:id`` tag value of the cluster's groups.
        :param master_queue: where the function sends ``asg-setup`` and drain messages.
        :param failed_invocations_queue: the on-failure destination of the function's
            asynchronous invocations (a standard queue).
            :default: ``master_queue``'s dead-letter queue, where the master agent looks for
                lost notifications; a new encrypted queue if it has none
        :param log_retention: how long the function's logs are kept.
            :default: one month
        :param timeout: the function's timeout.
            :default: 60 seconds
        :param zone_choices: for a single-zone cluster, ``(zone, private subnet id,
            placement group name or "")`` in the order the groups may move when launches
            fail for capacity (docs/capacity-adjuster.md, "Zone fallback"); the first is
            where the groups start. Fewer than two: the groups never move.
            :default: none
        :param max_zone_moves: how many times the groups may move before the worker count
            is lowered instead.
            :default: 0
        :param launch_retry_seconds: how long, from a group's creation, a launch that fails
            for a transient cause (``InsufficientInstanceCapacity``, ``RequestLimitExceeded``)
            is left to Auto Scaling's own retries before the worker count is lowered, the
            groups move to another zone, or a master that cannot launch fails the setup.
            Configuration and quota errors are acted on at once. 0: act on the first error.
            :default: 600 (``DEFAULT_LAUNCH_RETRY_SECONDS``)
        """
        super().__init__(scope, construct_id)
        if isinstance(launch_retry_seconds, bool) or not isinstance(launch_retry_seconds, int) \
                or not 0 <= launch_retry_seconds < MAX_LAUNCH_RETRY_SECONDS:
            raise ConfigError(
                f"CapacityAdjuster {construct_id}: launch_retry_seconds must be a whole number "
                f"of seconds from 0 to {MAX_LAUNCH_RETRY_SECONDS - 1} (inside the stack's setup "
                f"wait), got {launch_retry_seconds!r}")
        self.cluster_id = cluster_id
        self.key = kms.Key(
            self,
            "TopicKey",
            enable_key_rotation=True,
            description=f"Encrypts the Auto Scaling notification topic and the capacity "
            f"adjuster's logs of cluster {cluster_id}",
            removal_policy=RemovalPolicy.DESTROY,
        )
        # Auto Scaling's role (new on a fresh account) is not named in the key's policy:
        # KMS may not see it yet. It gets a grant once it can (ServiceRoleGrant, below).
        service_role = auto_scaling_service_linked_role(self)
        self.topic = sns.Topic(
            self,
            "Topic",
            master_key=self.key,
            enforce_ssl=True,
            display_name=f"{cluster_id} Auto Scaling notifications",
        )

        # CloudWatch Logs encrypts with the key only for this account's log groups here. The
        # encryption-context key is a String (StringLike, not ArnLike), and it exists only on
        # the cryptographic calls, so no kms:Describe* (it could never match).
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchLogsEncryptsLogGroups",
                principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*",
                         "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={"StringLike": {"kms:EncryptionContext:aws:logs:arn": (
                    f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:*")}},
            )
        )
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=log_retention,
            removal_policy=RemovalPolicy.DESTROY,
            encryption_key=self.key,
        )
        self.failed_invocations_queue = failed_invocations_queue or _dead_letters_of(
            self, master_queue)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"Capacity adjuster of cluster {cluster_id}: only this cluster's groups",
        )
        self.log_group.grant_write(self.role)
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadGroups",
                actions=["autoscaling:DescribeAutoScalingGroups"],
                resources=["*"],  # this Describe API supports no resource-level permissions
            )
        )
        self.role.add_to_policy(
            this_clusters_groups(
                self,
                sid="AdjustOnlyThisClustersGroups",
                cluster_id=cluster_id,
                actions=["autoscaling:SetDesiredCapacity"],
            )
        )
        master_queue.grant_send_messages(self.role)
        moves = min(max_zone_moves, max(len(zone_choices) - 1, 0))
        if moves:
            # Moving a group: its subnets (only the cluster's own) and, before the cluster
            # formed, replacing instances left in the zone it leaves.
            statement = this_clusters_groups(
                self, sid="MoveOnlyThisClustersGroups", cluster_id=cluster_id,
                actions=["autoscaling:UpdateAutoScalingGroup"])
            statement.add_condition("ForAllValues:StringEquals", {
                "autoscaling:VPCZoneIdentifiers": [subnet for _z, subnet, _p in zone_choices]})
            self.role.add_to_policy(statement)
            self.role.add_to_policy(this_clusters_groups(
                self, sid="ReplaceInstancesOfThisClustersGroups", cluster_id=cluster_id,
                actions=["autoscaling:TerminateInstanceInAutoScalingGroup"]))

        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            handler=HANDLER,
            code=lambda_.Code.from_asset(str(lambda_source_dir()), exclude=ASSET_EXCLUDES),
            role=self.role,
            timeout=timeout,
            memory_size=256,
            log_group=self.log_group,
            on_failure=destinations.SqsDestination(self.failed_invocations_queue),
            retry_attempts=RETRY_ATTEMPTS,
            max_event_age=MAX_EVENT_AGE,
            description="Lowers worker capacity when launches fail; reports cluster setup",
            environment={
                "MASTER_QUEUE_URL": master_queue.queue_url,
                "CLUSTER_ID": cluster_id,
                "CLUSTER_TAG_KEY": CLUSTER_TAG_KEY,
                "ROLE_TAG_KEY": ROLE_TAG_KEY,
                "LOG_LEVEL": "INFO",
                "ZONE_CHOICES": ",".join(f"{z}|{s}|{p}" for z, s, p in zone_choices),
                "MAX_ZONE_MOVES": str(moves),
                "LAUNCH_RETRY_SECONDS": str(launch_retry_seconds),
            },
        )
        # Auto Scaling may publish to the topic once its role may use the key.
        self.service_role_grant = ServiceRoleGrant(
            self, "AutoScalingMayUseTheKey", key=self.key, grantee_arn=service_role.role_arn,
            function=self.function, role=self.role, after=[service_role])
        self.topic.node.add_dependency(self.service_role_grant.resource)
        # Decrypting the notification is SNS's job; the function needs no key access.
        self.topic.add_subscription(subs.LambdaSubscription(self.function))

    def signal_setup_failures(self, wait_handle: CfnWaitConditionHandle) -> None:
        """Let the function fail the stack's setup wait itself when the master group cannot
        launch (no master agent exists to read the master queue then): it gets the handle's
        presigned URL (``WAIT_HANDLE_URL``); no IAM permission is involved."""
        self.function.add_environment("WAIT_HANDLE_URL", wait_handle.ref)


def _dead_letters_of(scope: Construct, queue: sqs.IQueue) -> sqs.IQueue:
    """``queue``'s dead-letter queue, or a new encrypted, TLS-only one."""
    dead_letters = queue.dead_letter_queue if isinstance(queue, sqs.Queue) else None
    if dead_letters is not None:
        return dead_letters.queue
    return sqs.Queue(scope, "FailedInvocations", encryption=sqs.QueueEncryption.SQS_MANAGED,
                     enforce_ssl=True, retention_period=Duration.days(14))


def this_clusters_groups(
    scope: Construct, *, sid: str, cluster_id: str, actions: list[str]
) -> iam.PolicyStatement:
    """Auto Scaling write ``actions`` on exactly the groups tagged ``dl-cluster:id=<id>``.

    Group ARNs contain a generated UUID, so the resource is a wildcard narrowed by an
    ``autoscaling:ResourceTag`` condition on the cluster's tag (docs/protocol.md, "Tags that
    identify a cluster's groups"); the one place this rule lives.
    """
    return iam.PolicyStatement(
        sid=sid,
        actions=actions,
        resources=[
            Stack.of(scope).format_arn(
                service="autoscaling",
                resource="autoScalingGroup",
                resource_name="*:autoScalingGroupName/*",
                arn_format=ArnFormat.COLON_RESOURCE_NAME,
            )
        ],
        conditions={"StringEquals": {f"autoscaling:ResourceTag/{CLUSTER_TAG_KEY}": cluster_id}},
    )


def grant_elastic_control(scope: Construct, role: iam.IRole, cluster_id: str) -> None:
    """The master agent completes drains and sets scale-in protection; ``dl-scale`` (run on
    the master) changes capacity and removes workers. Only this cluster's groups: the same
    tag condition as the capacity adjuster's."""
    role.add_to_principal_policy(
        this_clusters_groups(
            scope,
            sid="ElasticMembershipOfThisCluster",
            cluster_id=cluster_id,
            actions=[
                "autoscaling:CompleteLifecycleAction",
                "autoscaling:SetInstanceProtection",
                "autoscaling:SetDesiredCapacity",
                "autoscaling:TerminateInstanceInAutoScalingGroup",
                # the job controller marks a failed node's instance Unhealthy (replaced)
                "autoscaling:SetInstanceHealth",
            ],
        )
    )

"""The SQS queue through which the master learns the cluster's membership."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from constructs_lib.validation import reports_path

#: How long an unprocessed message stays on the master queue.
DEFAULT_RETENTION = Duration.days(4)
#: How long a message stays on the dead-letter queue.
DEAD_LETTER_RETENTION = Duration.days(14)
#: Receives after which a message the agent cannot process moves to the dead-letter queue.
MAX_RECEIVE_COUNT = 5


class MetadataQueues(Construct):
    """The master queue and its dead-letter queue: SQS-managed encryption, TLS-only policies.

    The dead-letter queue is where notifications meant for the master end up when they never
    reach it: master-queue messages received 5 times unprocessed, and (as its on-failure
    destination) the capacity adjuster's invocations that failed after Lambda's retries.

    The master queue carries the capacity adjuster's ``asg-setup`` / ``membership-change``
    messages to the master agent (docs/protocol.md, "Messages on the master queue"). Messages
    the agent cannot process go to the dead-letter queue after 5 receives instead of looping
    forever. Workers learn the membership from the shared file system, not from a queue.
    """

    @reports_path
    def __init__(
        self, scope: Construct, construct_id: str, *, retention: Duration = DEFAULT_RETENTION
    ) -> None:
        """
        :param retention: how long an unprocessed message stays on the master queue.
            :default: 4 days
        """
        super().__init__(scope, construct_id)
        dead_letters = sqs.Queue(
            self,
            "MasterDeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=DEAD_LETTER_RETENTION,
        )
        self.master_queue = sqs.Queue(
            self,
            "Master",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=retention,
            visibility_timeout=Duration.seconds(60),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=dead_letters, max_receive_count=MAX_RECEIVE_COUNT
            ),
        )
        self.master_dead_letter_queue = dead_letters

    def grant_agent_access(self, grantee: iam.IGrantable) -> iam.Grant:
        """What a node agent needs: consume the master queue."""
        return self.master_queue.grant_consume_messages(grantee)

    def grant_lost_notifications_read(self, grantee: iam.IGrantable) -> iam.Grant:
        """What the master agent needs on the dead-letter queue: look at (receive, never
        delete) it for lost notifications (the capacity adjuster's failed invocations), and
        send a master-queue message it refused there at once; the agent finds it through
        the master queue's redrive policy."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["sqs:ReceiveMessage", "sqs:GetQueueUrl", "sqs:SendMessage"],
            resource_arns=[self.master_dead_letter_queue.queue_arn],
        )

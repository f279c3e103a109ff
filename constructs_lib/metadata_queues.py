"""The two SQS queues through which the cluster learns its membership at boot."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct


class MetadataQueues(Construct):
    """Master and worker queues: SQS-managed encryption, TLS-only policies, dead-letter queues.

    The master queue carries the capacity adjuster's ``asg-setup`` / ``membership-change``
    messages to the master agent (docs/protocol.md). Messages the agent cannot process go to
    the dead-letter queue after 5 receives instead of looping forever.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, retention: Duration = Duration.days(4)
    ) -> None:
        super().__init__(scope, construct_id)
        self.master_queue = self._queue("Master", retention)
        self.worker_queue = self._queue("Worker", retention)

    def _queue(self, name: str, retention: Duration) -> sqs.Queue:
        dead_letters = sqs.Queue(
            self,
            f"{name}DeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        return sqs.Queue(
            self,
            name,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=retention,
            visibility_timeout=Duration.seconds(60),
            dead_letter_queue=sqs.DeadLetterQueue(queue=dead_letters, max_receive_count=5),
        )

    def grant_agent_access(self, grantee: iam.IGrantable) -> None:
        """What a node agent needs: consume both queues and post to the worker queue."""
        self.master_queue.grant_consume_messages(grantee)
        self.worker_queue.grant_consume_messages(grantee)
        self.worker_queue.grant_send_messages(grantee)

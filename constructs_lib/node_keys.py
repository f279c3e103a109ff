"""The node-keys queue: how each worker's public key reaches the master, vouched for by AWS.

Every node writes records on EFS that the master acts on (its registration, its job
executor's heartbeat, its drain acknowledgement), and root on any worker can write any file
on EFS. So each node signs its records with a key pair of its own, made at boot on its local
disk (``bootstrap_scripts/node/node_keys.py``), and the master believes a record only with the
signature of the node it names (docs/security.md). The master must learn each public key
from its own instance, not from EFS: a worker sends it on this queue, and the master takes
the instance from the message's ``SenderId``, which SQS sets from the request's signature
(an instance profile's role session is ``<role id>:<instance id>``,
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html),
never from the body (``bootstrap_scripts/agent/node_keys_queue.py``).

So the workers' role may only send here, the master's only receive and delete; the queue is
encrypted (SQS-managed keys, as the cluster's other queues) and TLS only. A message is sent
again every few minutes and whenever the master changes, so it is kept an hour; no
dead-letter queue: a message the master refuses is logged and deleted, one it cannot read
comes back until it expires, and the next one replaces it.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

#: How long a key message is kept (the workers send again every 5 minutes).
RETENTION = Duration.hours(1)


class NodeKeysQueue(Construct):
    """The queue workers announce their public keys on; :meth:`grant` after the groups."""

    def __init__(self, scope: Construct, construct_id: str, *,
                 retention: Duration = RETENTION) -> None:
        """:param retention: how long SQS keeps a key message.

            :default: 1 hour
        """
        super().__init__(scope, construct_id)
        #: The queue (its URL goes into every node's user data).
        self.queue = sqs.Queue(self, "Queue", encryption=sqs.QueueEncryption.SQS_MANAGED,
                               enforce_ssl=True, visibility_timeout=Duration.seconds(30),
                               retention_period=retention)

    def grant(self, *, workers: iam.IGrantable, master: iam.IGrantable) -> None:
        """``workers`` may send (nothing else), ``master`` may receive and delete."""
        self.queue.grant_send_messages(workers)
        self.queue.grant_consume_messages(master)

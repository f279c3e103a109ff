"""A queue whose messages are believed only for the instance SQS names as the sender.

Workers tell the master things through SQS queues on which the workers' role may only send
and the master's alone receive and delete (warm-pool readiness: ``agent.warm_ready``; each
node's public key: ``agent.node_keys_queue``). The body of such a message is whatever root on
any worker wrote; the sender is not: SQS sets ``SenderId`` from the request's signature, for
an IAM role session ``<role id>:<session name>``, and EC2 names an instance profile's session
after the instance ("the IAM role ID, for example ``ABCDE1F2GH3I4JK5LMNOP:i-a123b456``",
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html).
A worker's credentials can only ever name its own instance, so a message speaks for the
instance that sent it, and only when the sender's role is the workers'.

:func:`instance_of_sender` is that pure check; :class:`SenderQueue` the master's loop around
it (receive with ``SenderId``, handle, delete; until stopped, a failed call logged and retried
after a pause), which each queue gives only its handling.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

#: An EC2 instance ID (the session name EC2 gives an instance profile's role session).
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
#: An IAM role's unique ID (AROA + 16..128 upper-case letters or digits).
ROLE_ID = re.compile(r"^AROA[A-Z0-9]{12,124}$")
#: Long-poll wait of the master's receive (SQS's maximum).
RECEIVE_WAIT = 20
#: Pause after a failed receive (throttling, a network blip) before the next one.
FAILED_PAUSE = 5.0


def instance_of_sender(sender_id: str, worker_role_id: str) -> tuple[str | None, str]:
    """(the instance ID the message may speak for, "") or (None, why it speaks for none).

    ``sender_id``: SQS's ``SenderId`` of the message; ``worker_role_id``: the workers' role's
    unique ID (from the stack). A sender that is not a session of the workers' role, or whose
    session is not an instance's, is refused."""
    role_id, _, session = (sender_id or "").partition(":")
    if not ROLE_ID.match(worker_role_id or ""):
        return None, f"no valid workers' role ID is configured ({worker_role_id!r})"
    if role_id != worker_role_id:
        return None, f"sender {sender_id!r} is not a session of the workers' role"
    if not INSTANCE_ID.match(session):
        return None, f"sender {sender_id!r} is not an instance's role session"
    return session, ""


class SenderQueue:
    """The master's receiving loop of one such queue; a subclass says what a message does
    (:meth:`handle`) and how the SQS client is had (:meth:`client`)."""

    #: The log events' prefix (``event=<prefix>-receive-failed``).
    event = "sender-queue"

    def __init__(self, *, queue_url: str, worker_role_id: str, log: logging.Logger,
                 stop: threading.Event) -> None:
        self.queue_url = queue_url
        self.worker_role_id = worker_role_id
        self.log = log
        self.stop = stop

    def client(self) -> Any | None:
        """The SQS client; None while it is not made yet (the loop waits a little)."""
        raise NotImplementedError

    def handle(self, sender: str, body: str) -> bool:
        """Act on one message from ``sender`` (SQS's ``SenderId``); True to delete it, False
        to leave it for another receive (SQS delivers it again after its visibility
        timeout)."""
        raise NotImplementedError

    def serve_once(self, wait: int = RECEIVE_WAIT) -> int:
        """One long poll; the number of messages handled and deleted."""
        sqs = self.client()
        if sqs is None:
            self.stop.wait(0.5)
            return 0
        resp = sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait,
            MessageSystemAttributeNames=["SenderId"])
        handled = 0
        for message in resp.get("Messages", []):
            sender = message.get("Attributes", {}).get("SenderId", "")
            if not self.handle(sender, message.get("Body", "")):
                continue
            sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
            handled += 1
        return handled

    def serve(self) -> None:
        """Until ``stop``: a failed call is logged and retried after a pause."""
        while not self.stop.is_set():
            try:
                self.serve_once()
            except Exception as exc:
                self.log.warning("event=%s-receive-failed error=%r", self.event, exc)
                self.stop.wait(FAILED_PAUSE)

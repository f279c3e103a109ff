"""A warm-pool worker says it is ready; the master, sure of who said it, completes its launch.

A worker of a group with a warm pool is held by the group's launch hook
(``Warmed:Pending:Wait`` on its way into the pool, ``Pending:Wait`` on its way into service)
until its bootstrap is done. Someone must then complete that instance's lifecycle action.
If the workers did it themselves, their role would need ``autoscaling:CompleteLifecycleAction``
on the worker group, and AWS has no condition key that ties an action to the calling
instance: root on one worker could complete another pending worker's action early, stopping
it (or sending it into service) before its agent finished installing.

So a worker only *says* it is ready, with a message on the cluster's warm-ready queue, on
which the workers' role may only send. The master (whose role alone may receive, and complete
the worker group's actions) does not believe what the message says; it believes SQS's
``SenderId``, which SQS sets from the request's signature: for an IAM role session,
``<role id>:<session name>``, and EC2 names an instance profile's session after the instance
("the IAM role ID, for example ``ABCDE1F2GH3I4JK5LMNOP:i-a123b456``",
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html).
A worker's credentials can only ever name its own instance, so the master completes the
action of the instance that sent the message, and only if the sender's role is the workers'.

:func:`instance_of_sender` is the pure check; :class:`ReadySignal` the worker's send;
:class:`ReadyServer` the master's loop.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable

#: An EC2 instance ID (the session name EC2 gives an instance profile's role session).
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
#: An IAM role's unique ID (AROA + 16..128 upper-case letters or digits).
ROLE_ID = re.compile(r"^AROA[A-Z0-9]{12,124}$")
#: Long-poll wait of the master's receive (SQS's maximum).
RECEIVE_WAIT = 20


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


class ReadySignal:
    """The worker's side: one message on the warm-ready queue (the body is for people
    reading the queue; the master trusts only the sender)."""

    def __init__(self, *, queue_url: str, region: str, instance_id: str, hook_name: str,
                 client=None) -> None:
        self.queue_url = queue_url
        self.instance_id = instance_id
        self.hook_name = hook_name
        if client is None:
            import boto3  # only a node in a warm-pool group sends it

            client = boto3.session.Session(region_name=region).client("sqs")
        self.client = client

    def send(self) -> str:
        """``sent`` or raise (the caller retries)."""
        self.client.send_message(QueueUrl=self.queue_url, MessageBody=json.dumps(
            {"instance": self.instance_id, "hook": self.hook_name}))
        return "sent"


class ReadyServer:
    """The master's side: receive ready messages, complete the sending instance's launch
    action on the cluster's worker group, delete the message.

    ``complete(instance_id)`` completes that instance's action (CONTINUE) and returns an
    outcome text; an exception leaves the message for another receive (SQS delivers it again
    after its visibility timeout)."""

    def __init__(self, *, queue_url: str, worker_role_id: str, sqs,
                 complete: Callable[[str], str], log: logging.Logger,
                 stop: threading.Event) -> None:
        self.queue_url = queue_url
        self.worker_role_id = worker_role_id
        self.sqs = sqs
        self.complete = complete
        self.log = log
        self.stop = stop

    def serve_once(self, wait: int = RECEIVE_WAIT) -> int:
        """One long poll; the number of messages handled (completed or refused)."""
        resp = self.sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait,
            MessageSystemAttributeNames=["SenderId"])
        handled = 0
        for message in resp.get("Messages", []):
            sender = message.get("Attributes", {}).get("SenderId", "")
            instance, why = instance_of_sender(sender, self.worker_role_id)
            if instance is None:
                self.log.warning("event=warm-ready-refused reason=%r body=%r", why,
                                 message.get("Body", "")[:200])
            else:
                try:
                    outcome = self.complete(instance)
                except Exception as exc:  # throttling, a network blip: SQS delivers it again
                    self.log.warning("event=warm-ready-complete-failed instance=%s error=%r",
                                     instance, exc)
                    continue
                self.log.info("event=warm-ready instance=%s outcome=%s", instance, outcome)
            self.sqs.delete_message(QueueUrl=self.queue_url,
                                    ReceiptHandle=message["ReceiptHandle"])
            handled += 1
        return handled

    def serve(self) -> None:
        """Until ``stop``: a failed call is logged and retried after a pause."""
        while not self.stop.is_set():
            try:
                self.serve_once()
            except Exception as exc:
                self.log.warning("event=warm-ready-receive-failed error=%r", exc)
                self.stop.wait(5.0)


def completer(autoscaling, *, cluster_id: str, hook_name: str) -> Callable[[str], str]:
    """``complete(instance_id)`` for :class:`ReadyServer`: CONTINUE the instance's action of
    ``hook_name`` on the cluster's worker group. "No active Lifecycle Action" (already
    completed, timed out, or not an instance of that group) is an outcome, not an error."""
    from botocore.exceptions import ClientError

    from bootstrap_scripts.agent.discovery import find_group

    def complete(instance_id: str) -> str:
        group = find_group(autoscaling, cluster_id, "worker")
        if group is None:
            raise RuntimeError(f"no worker group of cluster {cluster_id!r}")
        try:
            autoscaling.complete_lifecycle_action(
                LifecycleHookName=hook_name, AutoScalingGroupName=group["AutoScalingGroupName"],
                InstanceId=instance_id, LifecycleActionResult="CONTINUE")
        except ClientError as exc:
            message = str(exc.response.get("Error", {}).get("Message", ""))
            if "No active Lifecycle Action" in message:
                return "none-waiting"
            raise
        return "completed"

    return complete

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
the worker group's actions) does not believe what the message says; it completes the action of
the instance SQS names as the sender, and only if the sender's role is the workers'
(``bootstrap_scripts.agent.sender_queue``: why ``SenderId`` can be believed).

:func:`instance_of_sender` is the pure check; :class:`ReadySignal` the worker's send;
:class:`ReadyServer` the master's loop.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from bootstrap_scripts.agent.sender_queue import SenderQueue, instance_of_sender

#: What other modules take from here (the sender check itself lives in ``sender_queue``).
__all__ = ["ReadyServer", "ReadySignal", "completer", "instance_of_sender"]


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


class ReadyServer(SenderQueue):
    """The master's side: receive ready messages, complete the sending instance's launch
    action on the cluster's worker group, delete the message.

    ``complete(instance_id)`` completes that instance's action (CONTINUE) and returns an
    outcome text; an exception leaves the message for another receive (SQS delivers it again
    after its visibility timeout)."""

    event = "warm-ready"

    def __init__(self, *, queue_url: str, worker_role_id: str, sqs,
                 complete: Callable[[str], str], log: logging.Logger,
                 stop: threading.Event) -> None:
        super().__init__(queue_url=queue_url, worker_role_id=worker_role_id, log=log,
                         stop=stop)
        self.sqs = sqs
        self.complete = complete

    def client(self) -> Any:
        return self.sqs

    def handle(self, sender: str, body: str) -> bool:
        instance, why = instance_of_sender(sender, self.worker_role_id)
        if instance is None:
            self.log.warning("event=warm-ready-refused reason=%r body=%r", why, body[:200])
            return True
        try:
            outcome = self.complete(instance)
        except Exception as exc:  # throttling, a network blip: SQS delivers it again
            self.log.warning("event=warm-ready-complete-failed instance=%s error=%r",
                             instance, exc)
            return False
        self.log.info("event=warm-ready instance=%s outcome=%s", instance, outcome)
        return True


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

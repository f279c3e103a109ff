"""Notifications that never reached the master, read from the master queue's dead-letter queue.

SNS invokes the capacity adjuster asynchronously. An invocation that still fails after
Lambda's retries (or ages out of Lambda's queue) is not dropped: the function's on-failure
destination is the master queue's dead-letter queue, which receives an *invocation record*
(https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-retain-records.html), and
master-queue messages the agent received 5 times without processing land there too. While
the master waits for the groups' setup it looks at that queue, so a lost notification fails
the wait condition with a reason that names it instead of timing out 55 minutes later.

The queue is found through the master queue's ``RedrivePolicy`` attribute (no extra
setting), and only looked at: ``ReceiveMessage`` with ``VisibilityTimeout=0`` leaves every
message visible and in place for whoever investigates. Failed calls are logged and answered
with nothing: this check must never be what fails a cluster.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

#: Records sent this long before the master agent's setup started still count: the master's
#: own launch notification is sent before its agent starts, and Lambda's two retries take
#: at least three minutes.
LOOKBACK_SECONDS = 900.0
#: Longest text kept from an error message or an unrecognised body.
TEXT_LIMIT = 300


@dataclass(frozen=True)
class LostNotification:
    """One message on the dead-letter queue: when it was sent, and what it says."""

    sent: float
    what: str


def describe(body: str) -> str:
    """One line for a dead-letter message: a Lambda invocation record names the condition,
    the attempts, the error and the Auto Scaling notification it carried."""
    try:
        record = json.loads(body)
    except ValueError:
        record = None
    if not isinstance(record, dict) or "requestContext" not in record:
        return f"a master-queue message was never processed: {body[:TEXT_LIMIT]!r}"
    context = record.get("requestContext") or {}
    response = record.get("responsePayload")
    error = ""
    if isinstance(response, dict):
        error = ": ".join(str(response[k]) for k in ("errorType", "errorMessage") if k in response)
    return (f"the capacity adjuster dropped {_notification(record.get('requestPayload'))} "
            f"({context.get('condition', 'failed')} after "
            f"{context.get('approximateInvokeCount', '?')} attempt(s)"
            f"{'; ' + error[:TEXT_LIMIT] if error else ''})")


def _notification(payload: Any) -> str:
    """'autoscaling:EC2_INSTANCE_LAUNCH of group G (instance i-...)' from an SNS event."""
    try:
        sns = payload["Records"][0]["Sns"]
        message = json.loads(sns["Message"])
    except (KeyError, IndexError, TypeError, ValueError):
        return "a notification"
    event = message.get("Event") or message.get("LifecycleTransition") or "a notification"
    group = message.get("AutoScalingGroupName", "")
    instance = message.get("EC2InstanceId", "")
    return (f"{event}{' of group ' + group if group else ''}"
            f"{' (instance ' + instance + ')' if instance else ''}")


def reason(cluster_id: str, lost: list[LostNotification]) -> str:
    """The wait-condition FAILURE reason for ``lost`` (first three, then a count)."""
    shown = "; ".join(n.what for n in lost[:3])
    more = f"; and {len(lost) - 3} more" if len(lost) > 3 else ""
    return (f"cluster {cluster_id}: a notification meant for the master was lost, so the "
            f"cluster cannot form as deployed: {shown}{more} (all kept on the master queue's "
            f"dead-letter queue; docs/capacity-adjuster.md, \"Lost notifications\")")


#: Message attribute the master agent puts on a master-queue message it refused and moved
#: here itself (:meth:`bootstrap_scripts.agent.aws.MasterAws.refuse`): seen, logged, and
#: not a lost notification.
REFUSED_ATTRIBUTE = "dl-agent-refused"


def dead_letter_queue_url(sqs: Any, master_queue_url: str) -> str | None:
    """The URL of the master queue's dead-letter queue, from its ``RedrivePolicy`` (None:
    the queue has none). AWS errors are raised to the caller."""
    attrs = sqs.get_queue_attributes(QueueUrl=master_queue_url,
                                     AttributeNames=["RedrivePolicy"]).get("Attributes", {})
    policy = attrs.get("RedrivePolicy")
    if not policy:
        return None
    # arn:<partition>:sqs:<region>:<account>:<name>
    *_, account, name = json.loads(policy)["deadLetterTargetArn"].split(":")
    return sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]


class LostNotifications:
    """Looks at the dead-letter queue of ``master_queue_url`` with the master's SQS client."""

    def __init__(self, master_queue_url: str, log: logging.Logger) -> None:
        self.master_queue_url = master_queue_url
        self.log = log
        self.queue_url: str | None = None
        self.no_queue = False  # the master queue has no dead-letter queue: nothing to look at

    def since(self, sqs: Any, start: float) -> list[LostNotification]:
        """Dead-letter messages sent at or after ``start`` (seconds since the epoch)."""
        url = self._resolve(sqs)
        if not url:
            return []
        try:
            resp = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                       VisibilityTimeout=0, AttributeNames=["SentTimestamp"],
                                       MessageAttributeNames=[REFUSED_ATTRIBUTE])
        except Exception as exc:
            self.log.warning("event=lost-notifications-check-failed queue=%s error=%r", url, exc)
            return []
        found = []
        for m in resp.get("Messages", []):
            if REFUSED_ATTRIBUTE in (m.get("MessageAttributes") or {}):
                continue  # the agent refused it itself (logged then): not a lost notification
            sent = int(m.get("Attributes", {}).get("SentTimestamp", "0")) / 1000.0
            if sent >= start:
                found.append(LostNotification(sent, describe(m.get("Body", ""))))
        return sorted(found, key=lambda n: n.sent)

    def _resolve(self, sqs: Any) -> str | None:
        if self.queue_url or self.no_queue:
            return self.queue_url
        try:
            self.queue_url = dead_letter_queue_url(sqs, self.master_queue_url)
            if not self.queue_url:
                self.no_queue = True
                self.log.info("event=lost-notifications-off reason='the master queue has no "
                              "dead-letter queue'")
                return None
        except Exception as exc:
            self.log.warning("event=lost-notifications-check-failed error=%r", exc)
            return None
        self.log.info("event=lost-notifications-queue url=%s", self.queue_url)
        return self.queue_url

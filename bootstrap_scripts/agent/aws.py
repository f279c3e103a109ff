"""Every AWS call the node agent makes, in one place (only the master makes any).

- SQS: long-poll the master queue, delete what was processed, move what cannot be
  processed to the master queue's dead-letter queue at once (:meth:`MasterAws.refuse`);
- Auto Scaling / EC2: describe this cluster's groups and their instances (through
  :mod:`bootstrap_scripts.agent.discovery`), set scale-in protection, and complete a
  drained instance's lifecycle action, classifying its errors into "retry" and "final".

Nothing here decides anything about the cluster; callers get plain results and log lines
name the call that failed. Creating the boto3 clients takes about half a second of CPU, so
:meth:`MasterAws.start` does it in a thread while the agent fetches its identity and mounts
EFS.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from bootstrap_scripts.agent import discovery as disco
from bootstrap_scripts.agent.lost_notifications import REFUSED_ATTRIBUTE, dead_letter_queue_url
from bootstrap_scripts.protocol.messages import BadMessage, Message, parse_message
from bootstrap_scripts.protocol.records import DrainRecord

#: SetInstanceProtection takes at most this many instance ids per call.
PROTECT_BATCH = 50
#: Longest text kept from an error in a drain record's ``outcome``.
OUTCOME_LIMIT = 300
#: Longest refusal reason put on a dead-lettered message (an SQS attribute value).
REFUSAL_LIMIT = 1000


@dataclass(frozen=True)
class Completion:
    """What CompleteLifecycleAction came to.

    ``final`` is False only for errors worth another attempt (throttling, network); the
    ``outcome`` text then still lacks the "gave up" wording, which the caller adds when it
    stops retrying."""

    final: bool
    outcome: str
    error: BaseException | None = None


def classify_completion_error(exc: BaseException) -> Completion:
    """A failed CompleteLifecycleAction: is there any point in trying again?

    - bad parameters (botocore's ``ParamValidationError``): no, a retry sends the same;
    - ``ValidationError`` from Auto Scaling: no action is waiting any more (already
      completed, or the hook timed out and Auto Scaling continued by itself);
    - anything else: yes (throttling, a network blip)."""
    response = getattr(exc, "response", None)
    code = response.get("Error", {}).get("Code", "") if isinstance(response, dict) else ""
    if type(exc).__name__ == "ParamValidationError":
        return Completion(True, f"invalid-request (the hook's default CONTINUE applies): "
                                f"{exc}"[:OUTCOME_LIMIT], exc)
    if code == "ValidationError":
        return Completion(True, f"no-active-action: {exc}"[:OUTCOME_LIMIT], exc)
    return Completion(False, repr(exc), exc)


class MasterAws:
    """The master agent's AWS clients and calls. ``log`` is the agent's logger (set by the
    master once the agent knows its instance id)."""

    def __init__(self, *, region: str, queue_url: str, cluster_id: str,
                 stop: threading.Event, log: logging.Logger | None = None) -> None:
        self.region = region
        self.queue_url = queue_url
        self.cluster_id = cluster_id
        self.stop = stop
        self.log = log or logging.getLogger(__name__)
        self.sqs = self.autoscaling = self.ec2 = None
        #: True only while blocked in an SQS long poll, where stopping at once is safe: a
        #: message received but not yet processed is simply delivered again later.
        self.interruptible = False
        self._thread: threading.Thread | None = None
        self._dead_letters: str | None = None

    # -- clients ---------------------------------------------------------------------------
    def start(self) -> None:
        """Create the clients in the background (see :meth:`ready`)."""
        self._thread = threading.Thread(target=self.connect, daemon=True, name="aws-clients")
        self._thread.start()

    def connect(self) -> None:
        """Create the clients once the instance role's credentials can be found.

        A client made while they cannot (instance metadata slow to answer at boot) would
        have none for its whole life, so the lookup is retried until it succeeds or the
        agent stops."""
        import boto3  # only the master talks to AWS APIs

        delay = 1.0
        while True:
            session = boto3.session.Session(region_name=self.region)
            if session.get_credentials() is not None or self.stop.is_set():
                break
            self.log.warning("event=no-credentials-yet retry_in=%.0fs", delay)
            if self.stop.wait(delay):
                break
            delay = min(delay * 2, 30.0)
        self.sqs = session.client("sqs")
        self.autoscaling = session.client("autoscaling")
        self.ec2 = session.client("ec2")

    def ready(self) -> bool:
        """Wait for :meth:`start`'s thread; True when the clients exist."""
        if self._thread is not None:
            self._thread.join()
        return self.sqs is not None and self.ec2 is not None

    # -- the master queue ------------------------------------------------------------------
    def receive(self, wait: int) -> list[tuple[str, Message]]:
        """Long-poll the master queue; (receipt handle, parsed message) pairs. A failed call
        is logged and answered with nothing after a short pause (network blips must not kill
        the agent)."""
        try:
            self.interruptible = True  # a stop signal may abandon this call (nothing is lost)
            try:
                resp = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                                WaitTimeSeconds=wait)
            finally:
                self.interruptible = False
        except Exception as exc:
            self.log.warning("event=sqs-receive-failed error=%r", exc)
            self.stop.wait(min(5.0, max(wait, 1)))
            return []
        out: list[tuple[str, Message]] = []
        for m in resp.get("Messages", []):
            body = m.get("Body", "")
            msg = parse_message(body)
            if isinstance(msg, BadMessage):
                self.refuse(m["ReceiptHandle"], body, msg.reason)
            else:
                out.append((m["ReceiptHandle"], msg))
        return out

    def refuse(self, receipt: str, body: str, reason: str) -> bool:
        """A message the agent cannot process: log why, send its body unchanged to the
        master queue's dead-letter queue (marked with the ``dl-agent-refused`` attribute,
        the reason), then delete it here. True once it is there.

        At once, rather than SQS's redrive after the 5th receive: five more receives would
        be five more chances for it to hurt, and minutes of noise. If the send fails the
        message stays on the master queue and redrive still moves it after 5 receives
        (each refused again without harm); with no dead-letter queue it is deleted."""
        self.log.warning("event=refused-message reason=%r body=%r", reason, body[:200])
        try:
            if self._dead_letters is None:
                self._dead_letters = dead_letter_queue_url(self.sqs, self.queue_url) or ""
            if self._dead_letters:
                self.sqs.send_message(
                    QueueUrl=self._dead_letters, MessageBody=body,
                    MessageAttributes={REFUSED_ATTRIBUTE: {
                        "DataType": "String", "StringValue": reason[:REFUSAL_LIMIT] or "-"}})
        except Exception as exc:
            self.log.warning("event=dead-letter-failed error=%r (left on the master queue: "
                             "SQS moves it to the dead-letter queue after its 5th receive)",
                             exc)
            return False
        self.delete(receipt)
        if not self._dead_letters:
            self.log.warning("event=refused-message-deleted reason='the master queue has no "
                             "dead-letter queue'")
            return False
        self.log.info("event=dead-lettered queue=%s", self._dead_letters)
        return True

    def delete(self, receipt: str) -> None:
        try:
            self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt)
        except Exception as exc:
            self.log.warning("event=sqs-delete-failed error=%r", exc)

    # -- groups and instances --------------------------------------------------------------
    def group_state(self, role: str) -> disco.GroupState | None:
        """The cluster's group for ``role`` and its live instances (DiscoveryError when the
        tags are ambiguous)."""
        return disco.group_state(self.autoscaling, self.ec2, self.cluster_id, role)

    def describe_addresses(self, instance_ids: Sequence[str]) -> dict[str, disco.Instance]:
        return disco.describe_addresses(self.ec2, list(instance_ids))

    def protect(self, role: str, group: str, instance_ids: Sequence[str]) -> bool:
        """Scale-in protection for ``instance_ids`` of ``group`` (idempotent). A failure is
        logged, not raised: dl-scale still refuses to remove protected nodes."""
        ids = list(instance_ids)
        try:
            for start in range(0, len(ids), PROTECT_BATCH):
                self.autoscaling.set_instance_protection(
                    InstanceIds=ids[start:start + PROTECT_BATCH], AutoScalingGroupName=group,
                    ProtectedFromScaleIn=True)
        except Exception as exc:
            self.log.warning("event=protect-failed role=%s asg=%s error=%r", role, group, exc)
            return False
        self.log.info("event=protected role=%s asg=%s instances=%s", role, group, ",".join(ids))
        return True

    def complete_lifecycle_action(self, record: DrainRecord) -> Completion:
        """CONTINUE the lifecycle action the drain record holds."""
        try:
            self.autoscaling.complete_lifecycle_action(
                LifecycleHookName=record.lifecycle_hook, AutoScalingGroupName=record.asg,
                LifecycleActionToken=record.lifecycle_action_token,
                LifecycleActionResult="CONTINUE", InstanceId=record.instance_id)
        except Exception as exc:
            return classify_completion_error(exc)
        return Completion(True, "completed")

"""Parse SNS records carrying Amazon EC2 Auto Scaling notifications, defensively.

The real service publishes one JSON document per SNS message (``Sns.Message`` is a JSON
*string*), for example (launch error; values shortened)::

    {"Origin": "EC2", "Destination": "AutoScalingGroup", "Progress": 100,
     "AccountId": "123456789012", "Description": "Launching a new EC2 instance.  Status
     Reason: ...", "RequestId": "...", "EndTime": "...", "AutoScalingGroupARN": "arn:...",
     "ActivityId": "...", "StartTime": "...", "Service": "AWS Auto Scaling", "Time": "...",
     "EC2InstanceId": "", "StatusCode": "Failed", "StatusMessage": "We currently do not have
     sufficient p3.2xlarge capacity ...", "Details": {"Subnet ID": "...", "Availability
     Zone": "..."}, "AutoScalingGroupName": "...", "Cause": "At ... a user request ...",
     "Event": "autoscaling:EC2_INSTANCE_LAUNCH_ERROR"}

``autoscaling:TEST_NOTIFICATION`` (sent when the notification configuration is created,
and again when a lifecycle hook is created with this topic as target) is smaller:
``AccountId, RequestId, AutoScalingGroupARN, AutoScalingGroupName, Service, Event, Time``.

Lifecycle-hook notifications (the worker group's ``drain`` hook, docs/elastic.md) have no
``Event`` at all; they carry ``LifecycleTransition`` instead::

    {"Origin": "AutoScalingGroup", "Destination": "EC2", "LifecycleHookName": "drain",
     "AccountId": "123456789012", "RequestId": "...", "LifecycleTransition":
     "autoscaling:EC2_INSTANCE_TERMINATING", "AutoScalingGroupName": "...", "Service":
     "AWS Auto Scaling", "Time": "...", "EC2InstanceId": "i-...", "LifecycleActionToken":
     "<uuid>"}  (+ "NotificationMetadata" when the hook has metadata)

With a warm pool (``warmPoolSize``), ``Origin`` and ``Destination`` say where the instance
goes (https://docs.aws.amazon.com/autoscaling/ec2/userguide/warm-pool-instance-lifecycle.html,
"Lifecycle hooks" and the event examples of
https://docs.aws.amazon.com/autoscaling/ec2/userguide/warm-pools-eventbridge-events.html):
``EC2`` -> ``WarmPool`` (launched into the pool, to be stopped there), ``WarmPool`` ->
``AutoScalingGroup`` (leaving the pool into service), ``WarmPool`` -> ``EC2`` (a pool
instance terminated), ``AutoScalingGroup`` -> ``WarmPool`` (scale-in back to the pool, which
this stack never configures). Only the group's in-service side is the cluster: an instance
launched into the pool, its launch error, and a pool instance's termination are not a node
joining, failing or leaving (:attr:`Notification.warm_pool_only`). The field values are read
as AWS's documentation spells them; the emulator sends no warm-pool notification, so they are
tested against hand-written records (``tests/lambda/test_warm_pool_notifications.py``).

Examples of every type live in ``tests/lambda/fixtures/``.

Everything that comes in is untrusted: each check below turns a bad record into a
:class:`MalformedRecord` naming the offending field, so the handler can log it and move on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

LAUNCH = "autoscaling:EC2_INSTANCE_LAUNCH"
LAUNCH_ERROR = "autoscaling:EC2_INSTANCE_LAUNCH_ERROR"
TERMINATE = "autoscaling:EC2_INSTANCE_TERMINATE"
TERMINATE_ERROR = "autoscaling:EC2_INSTANCE_TERMINATE_ERROR"
TEST_NOTIFICATION = "autoscaling:TEST_NOTIFICATION"
#: ``Origin`` / ``Destination`` of an instance on its way into or out of a warm pool.
WARM_POOL = "WarmPool"
#: Lifecycle transitions (the ``LifecycleTransition`` of a lifecycle-hook notification).
INSTANCE_TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
INSTANCE_LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"
LIFECYCLE_TRANSITIONS = (INSTANCE_TERMINATING, INSTANCE_LAUNCHING)

#: Events that describe an instance of a group (everything but the test notification).
INSTANCE_EVENTS = (LAUNCH, LAUNCH_ERROR, TERMINATE, TERMINATE_ERROR)
KNOWN_EVENTS = (*INSTANCE_EVENTS, TEST_NOTIFICATION)

#: ``change`` values of membership-change messages, by notification event.
CHANGE_BY_EVENT = {
    LAUNCH: "launch",
    LAUNCH_ERROR: "launch-error",
    TERMINATE: "terminate",
    TERMINATE_ERROR: "terminate-error",
}

_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
#: The API's own pattern for hook names; tokens are UUIDs (length 36 in the API).
_HOOK_NAME = re.compile(r"^[A-Za-z0-9\-_/]{1,255}$")
_ACTION_TOKEN = re.compile(r"^[A-Za-z0-9-]{36}$")  # the API takes exactly 36 characters
#: Auto Scaling group names: 1..255 characters, none of them control characters (the API's
#: own pattern excludes most of them; we are stricter so a name is always safe to log/send).
_GROUP_NAME = re.compile(r"^[^\x00-\x1f\x7f\ud800-\udfff]{1,255}$")
#: Free-text fields are clipped: SQS bodies max out at 256 KiB and the agent only shows them.
MAX_TEXT = 2000


class MalformedRecord(ValueError):
    """A record is not a usable Auto Scaling notification; the message says why."""


@dataclass(frozen=True)
class Notification:
    """The fields of one Auto Scaling notification the adjuster acts on."""

    event: str
    group_name: str
    instance_id: str  # "" on launch errors (no instance came to be) and test notifications
    status_code: str
    status_message: str
    cause: str
    description: str
    activity_id: str
    #: Lifecycle-hook notifications only ("" otherwise).
    lifecycle_hook: str = ""
    lifecycle_action_token: str = ""
    #: ``Details`` of an instance notification: where the launch was ("" when absent).
    zone: str = ""
    subnet: str = ""
    #: Where the instance comes from and goes to (``EC2``, ``AutoScalingGroup``,
    #: ``WarmPool``; "" when absent, as in test notifications).
    origin: str = ""
    destination: str = ""

    @property
    def warm_pool_only(self) -> bool:
        """The instance is not a cluster node here: launched into the warm pool (or failed
        to), or terminated from it. Leaving the pool into service is a launch like any."""
        if self.event in (LAUNCH, LAUNCH_ERROR):
            return self.destination == WARM_POOL
        if self.event in (TERMINATE, TERMINATE_ERROR):
            return self.origin == WARM_POOL
        return False

    @property
    def is_test(self) -> bool:
        return self.event == TEST_NOTIFICATION

    @property
    def is_lifecycle(self) -> bool:
        return self.event in LIFECYCLE_TRANSITIONS


def sns_records(event: Any) -> list[Any]:
    """The ``Records`` list of a Lambda SNS event, or MalformedRecord for anything else."""
    if not isinstance(event, dict):
        raise MalformedRecord(f"event is a {type(event).__name__}, expected an object")
    records = event.get("Records")
    if not isinstance(records, list):
        raise MalformedRecord(
            f"event.Records is {type(records).__name__}, expected a list of SNS records"
        )
    return records


def _text(message: dict[str, Any], key: str) -> str:
    """An optional free-text field: absent/null → "", non-string → error, long → clipped."""
    value = message.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedRecord(f"{key} is a {type(value).__name__}, expected a string")
    return value[:MAX_TEXT]


def parse_record(record: Any) -> Notification:
    """Turn one SNS record into a :class:`Notification` (or raise MalformedRecord)."""
    if not isinstance(record, dict):
        raise MalformedRecord(f"record is a {type(record).__name__}, expected an object")
    source = record.get("EventSource", "aws:sns")
    if source != "aws:sns":
        raise MalformedRecord(f"EventSource={source!r}, expected 'aws:sns'")
    sns = record.get("Sns")
    if not isinstance(sns, dict):
        raise MalformedRecord(f"record.Sns is {type(sns).__name__}, expected an object")
    raw = sns.get("Message")
    if not isinstance(raw, str):
        raise MalformedRecord(f"Sns.Message is {type(raw).__name__}, expected a JSON string")
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise MalformedRecord(f"Sns.Message is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise MalformedRecord(
            f"Sns.Message decodes to a {type(message).__name__}, expected an object"
        )

    if "Event" not in message and "LifecycleTransition" in message:
        return _parse_lifecycle(message)
    event = message.get("Event")
    if not isinstance(event, str) or event not in KNOWN_EVENTS:
        raise MalformedRecord(f"unknown Event {str(event)[:100]!r}")

    group_name = _group_name(message)
    instance_id = _text(message, "EC2InstanceId")
    if instance_id and not _INSTANCE_ID.match(instance_id):
        raise MalformedRecord(f"EC2InstanceId {instance_id[:100]!r} is not an instance id")

    return Notification(
        event=event,
        group_name=group_name,
        instance_id=instance_id,
        status_code=_text(message, "StatusCode"),
        status_message=_text(message, "StatusMessage"),
        cause=_text(message, "Cause"),
        description=_text(message, "Description"),
        activity_id=_text(message, "ActivityId"),
        origin=_text(message, "Origin")[:64],
        destination=_text(message, "Destination")[:64],
        **_details(message),
    )


def _details(message: dict[str, Any]) -> dict[str, str]:
    """``Details`` {"Availability Zone", "Subnet ID"} as ``zone``/``subnet`` (bad → "")."""
    details = message.get("Details")
    if not isinstance(details, dict):
        return {"zone": "", "subnet": ""}
    zone, subnet = details.get("Availability Zone"), details.get("Subnet ID")
    return {"zone": zone[:64] if isinstance(zone, str) else "",
            "subnet": subnet[:64] if isinstance(subnet, str) else ""}


def _group_name(message: dict[str, Any]) -> str:
    group_name = message.get("AutoScalingGroupName")
    if not isinstance(group_name, str) or not _GROUP_NAME.match(group_name):
        raise MalformedRecord(
            f"AutoScalingGroupName {str(group_name)[:100]!r} is not a valid group name"
        )
    return group_name


def _parse_lifecycle(message: dict[str, Any]) -> Notification:
    """A lifecycle-hook notification: every field the completion call needs must be valid,
    because the master agent hands them back to CompleteLifecycleAction verbatim."""
    transition = message.get("LifecycleTransition")
    if not isinstance(transition, str) or transition not in LIFECYCLE_TRANSITIONS:
        raise MalformedRecord(f"unknown LifecycleTransition {str(transition)[:100]!r}")
    group_name = _group_name(message)
    instance_id = _text(message, "EC2InstanceId")
    if not _INSTANCE_ID.match(instance_id):
        raise MalformedRecord(f"EC2InstanceId {instance_id[:100]!r} is not an instance id")
    hook = _text(message, "LifecycleHookName")
    if not _HOOK_NAME.match(hook):
        raise MalformedRecord(f"LifecycleHookName {hook[:100]!r} is not a valid hook name")
    token = _text(message, "LifecycleActionToken")
    if not _ACTION_TOKEN.match(token):
        raise MalformedRecord(f"LifecycleActionToken {token[:100]!r} is not a valid token")
    return Notification(
        event=transition,
        group_name=group_name,
        instance_id=instance_id,
        status_code="",
        status_message="",
        cause="",
        description=_text(message, "NotificationMetadata"),
        activity_id=_text(message, "RequestId"),
        lifecycle_hook=hook,
        lifecycle_action_token=token,
        origin=_text(message, "Origin")[:64],
        destination=_text(message, "Destination")[:64],
    )

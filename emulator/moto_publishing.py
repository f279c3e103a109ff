"""How the emulated Auto Scaling groups publish their notifications (part of
``emulator.moto_extensions``, which calls :func:`install`).

Notification configurations: moto drops the group's ``NotificationConfigurations``. They
are kept from the template; an instance the group launches after its creation publishes
  ``autoscaling:EC2_INSTANCE_LAUNCH``, one it terminates ``autoscaling:EC2_INSTANCE_TERMINATE``
  (https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-sns-notifications.html).
  The instances created with the group (during the deploy) are announced by the demo.

What is published to an SNS topic is kept, in order, for :func:`published` (the control
endpoint's ``GET /published``): moto's CloudFormation creates no Lambda subscription, so
``emulator.notifications`` delivers each message to the real Lambda handler itself.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from emulator import notifications as nt

_LOCK = threading.Lock()
_PUBLISHED: list[dict] = []


def published(after: int = 0) -> list[dict]:
    """Every message published to an SNS topic with ``seq`` > ``after``:
    ``{"seq", "topic_arn", "subject", "message"}`` (``message`` the JSON text)."""
    with _LOCK:
        return [p for p in _PUBLISHED if p["seq"] > after]


def reset() -> None:
    """Forget what was published (with moto's reset of its backends)."""
    with _LOCK:
        _PUBLISHED.clear()


# -- publishing -----------------------------------------------------------------------------


def publish(group: Any, target: str, message: dict) -> None:
    """Publish ``message`` to an SNS topic or SQS queue ARN, as Auto Scaling does."""
    text = json.dumps(message, separators=(",", ":"))
    account, region = group.account_id, group.region
    if target.startswith("arn:aws:sqs:"):
        from moto.sqs.models import sqs_backends

        sqs_backends[account][region].send_message(target.split(":")[-1], text)
        return
    if not target.startswith("arn:aws:sns:"):
        return
    from moto.sns.models import sns_backends

    subject = nt.subject(message)[:100]
    sns_backends[account][region].publish(text, arn=target, subject=subject)
    with _LOCK:
        _PUBLISHED.append({"seq": len(_PUBLISHED) + 1, "topic_arn": target,
                           "subject": subject, "message": text})


def notify_group(group: Any, message: dict) -> None:
    """Publish a ready notification ``message`` to every notification configuration of
    ``group`` that asks for its ``Event`` (``emulator.capacity``'s launch errors)."""
    for topic, types in getattr(group, "emulator_notifications", []):
        if message.get("Event") in types:
            publish(group, topic, message)


def notify(group: Any, event: str, instance_id: str, cause: str = "") -> None:
    """``event`` to every notification configuration of ``group`` that asks for it."""
    for topic, types in getattr(group, "emulator_notifications", []):
        if event in types:
            publish(group, topic, nt.notification(
                event, group.name, instance_id=instance_id,
                desired=group.desired_capacity or 0, cause=cause))


def _wrap_group_from_cfn(original: Any) -> Any:
    def create_from_cloudformation_json(cls: Any, resource_name: str,
                                        cloudformation_json: dict[str, Any], account_id: str,
                                        region_name: str, **kwargs: Any) -> Any:
        group = original(resource_name, cloudformation_json, account_id, region_name,
                         **kwargs)
        configs = cloudformation_json["Properties"].get("NotificationConfigurations", [])
        group.emulator_notifications = [(c["TopicARN"], list(c.get("NotificationTypes", [])))
                                        for c in configs]
        return group

    return classmethod(create_from_cloudformation_json)


def install() -> None:
    """Keep each group's notification configurations from its template (moto drops them)."""
    from moto.autoscaling.models import FakeAutoScalingGroup

    FakeAutoScalingGroup.create_from_cloudformation_json = _wrap_group_from_cfn(  # type: ignore[method-assign]
        FakeAutoScalingGroup.create_from_cloudformation_json)

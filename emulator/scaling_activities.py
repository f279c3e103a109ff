"""Auto Scaling's activity history of failed launches (DescribeScalingActivities).

On AWS every launch attempt of a group is a scaling activity, and a failed one keeps
``StatusCode`` ``Failed`` with EC2's message as ``StatusMessage``: ``aws autoscaling
describe-scaling-activities`` is where an operator reads why a group stopped short
(https://docs.aws.amazon.com/autoscaling/ec2/userguide/ts-as-instancelaunchfailure.html,
https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_Activity.html). moto answers an
empty list. Here the failed launches the emulator plays (``emulator.capacity``: no capacity,
flaky launches; ``emulator.vcpu_quotas``: over the vCPU quota) are recorded from the same
notification document the group publishes (:func:`record`) and DescribeScalingActivities
answers them, newest first, for the named group or every group. Successful launches and
terminations are not recorded (docs/emulator.md).
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

_LOCK = threading.Lock()
#: (account, region) -> the recorded activities, oldest first.
_ACTIVITIES: dict[tuple[str, str], list[dict[str, Any]]] = {}
_INSTALLED = False


def _time(text: str) -> dt.datetime:
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return dt.datetime.now(dt.UTC)


def record(group: Any, message: dict[str, Any]) -> None:
    """Keep the failed launch ``message`` (an ``EC2_INSTANCE_LAUNCH_ERROR`` document) as an
    activity of ``group``."""
    details = message.get("Details") or {}
    activity = {
        "ActivityId": message.get("ActivityId", ""),
        "AutoScalingGroupName": group.name,
        "AutoScalingGroupARN": getattr(group, "arn", ""),
        "Description": message.get("Description", ""),
        "Cause": message.get("Cause", ""),
        "StartTime": _time(str(message.get("StartTime", ""))),
        "EndTime": _time(str(message.get("EndTime", ""))),
        "StatusCode": message.get("StatusCode", "Failed"),
        "StatusMessage": message.get("StatusMessage", ""),
        "Progress": 100,
        "Details": "{" + ",".join(f'"{k}":"{v}"' for k, v in details.items()) + "}",
    }
    with _LOCK:
        _ACTIVITIES.setdefault((group.account_id, group.region), []).append(activity)


def activities(account: str, region: str, group_name: str = "") -> list[dict[str, Any]]:
    """The recorded activities of that account and region (one group's with
    ``group_name``), newest first."""
    with _LOCK:
        found = list(_ACTIVITIES.get((account, region), []))
    return [a for a in reversed(found) if not group_name or
            a["AutoScalingGroupName"] == group_name]


def reset() -> None:
    """Forget every activity (with moto's reset of its backends)."""
    with _LOCK:
        _ACTIVITIES.clear()


def install() -> None:
    """Answer DescribeScalingActivities from the record (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.core.responses import ActionResult

    def describe_scaling_activities(self: Any) -> ActionResult:
        name = self._get_param("AutoScalingGroupName") or ""
        found = activities(self.current_account, self.region, name)
        limit = int(self._get_param("MaxRecords") or 100)
        return ActionResult({"Activities": found[:limit]})

    AutoScalingResponse.describe_scaling_activities = describe_scaling_activities  # type: ignore[method-assign]
    _INSTALLED = True

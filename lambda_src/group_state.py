"""What an Auto Scaling group looks like right now, and what the adjuster decides from it.

Decisions are pure functions of a :class:`GroupSnapshot` (no AWS calls here), which is what
makes duplicate and out-of-order notifications harmless: the same group state always gives
the same decision and the same message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Lifecycle states of an instance that is, or is about to be, a cluster node.
#: Pending:Wait / Pending:Proceed appear when a launch lifecycle hook holds the instance.
COUNTED_LIFECYCLE_STATES = frozenset({"InService", "Pending", "Pending:Wait", "Pending:Proceed"})
ROLES = {"master": "master", "worker": "worker"}


class NotOurGroup(Exception):
    """The group exists but is not one of this cluster's (or has no usable role tag)."""


@dataclass(frozen=True)
class GroupSnapshot:
    """The fields of DescribeAutoScalingGroups the adjuster needs, already validated."""

    name: str
    role: str  # "master" | "worker"
    min_size: int
    max_size: int
    desired: int
    instances: tuple[str, ...]  # counted (healthy InService/Pending) instance ids, sorted

    @property
    def launched(self) -> int:
        return len(self.instances)


def _int(group: dict[str, Any], key: str) -> int:
    value = group.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"group {group.get('AutoScalingGroupName')!r} has {key}={value!r}")
    return value


def snapshot_from_description(
    group: dict[str, Any], *, cluster_id: str, cluster_tag_key: str, role_tag_key: str
) -> GroupSnapshot:
    """Validate that ``group`` belongs to this cluster and count its healthy instances.

    Raises :class:`NotOurGroup` for a group without the cluster tag, with another cluster's
    id, or without a Master/Worker role tag: recognition is by tags only, never by name.
    """
    name = str(group.get("AutoScalingGroupName", ""))
    tags = {
        tag.get("Key"): tag.get("Value") for tag in group.get("Tags") or [] if isinstance(tag, dict)
    }
    if cluster_tag_key not in tags:
        raise NotOurGroup(f"group {name!r} has no {cluster_tag_key} tag")
    if tags[cluster_tag_key] != cluster_id:
        raise NotOurGroup(
            f"group {name!r} belongs to cluster {tags[cluster_tag_key]!r}, not {cluster_id!r}"
        )
    role_value = tags.get(role_tag_key)
    role = ROLES.get(str(role_value).strip().lower()) if role_value is not None else None
    if role is None:
        raise NotOurGroup(
            f"group {name!r} has {role_tag_key}={role_value!r}, expected Master or Worker"
        )
    counted = sorted(
        str(instance.get("InstanceId"))
        for instance in group.get("Instances") or []
        if isinstance(instance, dict)
        and instance.get("LifecycleState") in COUNTED_LIFECYCLE_STATES
        and instance.get("HealthStatus") == "Healthy"
        and instance.get("InstanceId")
    )
    return GroupSnapshot(
        name=name,
        role=role,
        min_size=_int(group, "MinSize"),
        max_size=_int(group, "MaxSize"),
        desired=_int(group, "DesiredCapacity"),
        instances=tuple(counted),
    )


@dataclass(frozen=True)
class LaunchDecision:
    """What to do after a launch or launch-error notification.

    ``action``: ``report`` (send asg-setup now), ``lower`` (set desired to ``new_desired``,
    then report), or ``wait`` (launches still outstanding; the last one will report).
    """

    action: str
    status: str  # "success" | "failure" | "" (wait)
    reason: str
    new_desired: int | None = None


def decide_launch(
    snapshot: GroupSnapshot, *, launch_error: bool, error_text: str
) -> LaunchDecision:
    """The adjuster's core rule (seed 001), with the original's bugs left out.

    - At (or above) desired: the group is set up → success.
    - A plain launch short of desired: other launches are still on their way → wait.
    - A launch error short of desired but at/above minimum: lower desired to what launched
      (only ever lower) → success, so the stack goes on with fewer workers.
    - A launch error below minimum: failure with a reason the master shows at once, instead
      of the wait condition timing out 55 minutes later.
    """
    launched, desired, minimum = snapshot.launched, snapshot.desired, snapshot.min_size
    if launched >= desired:
        return LaunchDecision(
            "report",
            "success",
            f"{snapshot.role} group {snapshot.name} is at its desired capacity: "
            f"{launched} of {desired} instance(s) launched",
        )
    if not launch_error:
        return LaunchDecision(
            "wait",
            "",
            f"{launched} of {desired} instance(s) launched; waiting for the other launches",
        )
    because = f": {error_text}" if error_text else ""
    if launched >= minimum:
        return LaunchDecision(
            "lower",
            "success",
            f"{desired - launched} launch(es) of {snapshot.role} group {snapshot.name} failed"
            f"{because}; desired capacity lowered from {desired} to {launched} "
            f"(minimum {minimum})",
            new_desired=launched,
        )
    # No group name here: the asg-setup message carries role and group, and the master
    # prefixes them ("worker group <name>: cannot reach ..."), so the name appears once.
    return LaunchDecision(
        "report",
        "failure",
        f"cannot reach its minimum: only {launched} of {desired} instance(s) launched, "
        f"minimum is {minimum}{because}",
    )

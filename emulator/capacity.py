"""Insufficient EC2 capacity, played as AWS plays it (``make demo`` ``--capacity-out``).

Registered by ``emulator.moto_extensions.install`` in the moto server's process. While an
instance type is "out" (everywhere, or in one zone), a group's launch of it fails the way
Auto Scaling shows it:

- a group with a mixed instances policy tries its overrides in priority order (the
  ``prioritized`` On-Demand allocation strategy) in each of its subnets' zones, and
  launches the first type that has capacity
  (https://docs.aws.amazon.com/autoscaling/ec2/userguide/allocation-strategies.html); a
  group without one has only its launch template's type;
- when no type has capacity in any of the group's zones, no instance comes to be, the
  desired capacity stays, and Auto Scaling publishes ``autoscaling:EC2_INSTANCE_LAUNCH_ERROR``
  with EC2's insufficient-capacity message as ``StatusMessage`` (for a mixed instances group
  prefixed "Could not launch On-Demand Instances. InsufficientInstanceCapacity - ", as its
  EC2 Fleet launch reports it) and the zone and subnet in ``Details``
  (https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-sns-notifications.html).
  Launch errors of the launches moto makes inside CreateAutoScalingGroup are published once
  the group's notification configuration exists (AWS creates both in one call);
- a group short of its desired capacity after a failed launch tries again, as Auto Scaling
  keeps launching toward the desired capacity (it only suspends launching
  administratively after about a day of failures:
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/as-suspend-resume-processes.html).
  AWS does not document the interval between attempts; the emulator retries every
  :data:`RETRY_SECONDS` (a shorter, documented emulated delay), each failed attempt
  publishing its own launch error. Retries run on moto_extensions' ticker (:func:`tick`);
- a fault hook (``POST /flaky-launches {"count": N, "tag": "KEY=VALUE"}``, :func:`set_flaky`)
  fails the next N launches of the groups with that tag with EC2's insufficient-capacity
  error (the group's first type, in its first zone), after which launches succeed: capacity
  that frees while the group retries;
- UpdateAutoScalingGroup keeps the group's mixed instances policy when the call does not
  name one (moto drops it), and the group then brings itself to its desired capacity in
  the new subnets, as Auto Scaling does after its subnets change.

moto itself launches every instance in the group's first subnet with the launch
template's type; this module picks the subnet and the type per instance instead. moto has
no placement groups at all: ``AWS::EC2::PlacementGroup``
(https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-ec2-placementgroup.html)
is created by name (``Ref`` and ``GroupName`` answer it) so a stack with one deploys; the
emulator places nothing by it.
Every failed launch is also an activity of the group (``emulator.scaling_activities``).
The control endpoint's ``POST /capacity-out {"out": ["TYPE[@ZONE]", ...]}`` sets what is out
(:func:`set_out`), before the deploy.
"""

from __future__ import annotations

import copy
import re
import threading
import time
import uuid
from typing import Any

from emulator import scaling_activities
from emulator.cfn_model import cfn_model

_LOCK = threading.RLock()
_OUT: set[tuple[str, str]] = set()  # (instance type, zone or "" for every zone)
#: The emulated delay between a group's failed launch and its next attempt (seconds).
RETRY_SECONDS = 5.0
_RETRIES: dict[int, tuple[float, Any]] = {}  # id(group) -> (when, group)
_FLAKY: dict[str, Any] = {"count": 0, "tag": ("", ""), "failed": 0}
_INSTALLED = False
_SPEC = re.compile(r"^([a-z][a-z0-9-]*\.[a-z0-9-]+)(?:@([a-z]{2}(?:-[a-z]+)+-\d[a-z]))?$")
LAUNCH_ERROR = "autoscaling:EC2_INSTANCE_LAUNCH_ERROR"
FLEET_PREFIX = "Could not launch On-Demand Instances. InsufficientInstanceCapacity - "


def parse_spec(spec: str) -> tuple[str, str]:
    """``TYPE`` or ``TYPE@ZONE`` → (type, zone or ""); ValueError naming the spec."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(f"capacity-out {spec!r} is not TYPE or TYPE@ZONE "
                         f"(e.g. p5.48xlarge or g5.xlarge@us-east-1a)")
    return match.group(1), match.group(2) or ""


def set_out(specs: list[str]) -> list[str]:
    """From now on these types (in these zones) have no capacity; returns them as set."""
    parsed = {parse_spec(s) for s in specs}
    with _LOCK:
        _OUT.clear()
        _OUT.update(parsed)
    return sorted(f"{t}@{z}" if z else t for t, z in parsed)


def set_flaky(count: int, tag: str) -> dict[str, Any]:
    """The next ``count`` launches of groups tagged ``KEY=VALUE`` fail for capacity."""
    key, sep, value = tag.partition("=")
    if count < 0 or not sep or not key:
        raise ValueError(f"flaky-launches needs count >= 0 and tag KEY=VALUE, got {count!r}, "
                         f"{tag!r}")
    with _LOCK:
        _FLAKY.update(count=int(count), tag=(key, value), failed=0)
    return {"count": count, "tag": tag}


def flaky_state() -> dict[str, Any]:
    """How many flaky launches are left, and how many failed so far."""
    with _LOCK:
        return {"left": _FLAKY["count"], "failed": _FLAKY["failed"]}


def reset() -> None:
    with _LOCK:
        _OUT.clear()
        _RETRIES.clear()
        _FLAKY.update(count=0, tag=("", ""), failed=0)
    scaling_activities.reset()


def _take_flaky(group: Any) -> bool:
    """This launch of ``group`` is one of the flaky ones (and is used up)."""
    with _LOCK:
        if _FLAKY["count"] <= 0:
            return False
        key, value = _FLAKY["tag"]
        tags = {t.get("key", t.get("Key")): t.get("value", t.get("Value"))
                for t in group.tags or [] if isinstance(t, dict)}
        if tags.get(key) != value:
            return False
        _FLAKY["count"] -= 1
        _FLAKY["failed"] += 1
        return True


def _retry_later(group: Any) -> None:
    with _LOCK:
        _RETRIES.setdefault(id(group), (time.monotonic() + RETRY_SECONDS, group))


def tick(now: float | None = None) -> None:
    """Auto Scaling's next attempt for every group whose retry is due (and still short).

    ``now`` (monotonic seconds) lets a test step past the retry delay without racing the
    emulator's own ticker thread, which calls this with the real time."""
    now = time.monotonic() if now is None else now
    with _LOCK:
        due = [(k, g) for k, (at, g) in _RETRIES.items() if at <= now]
        for key, _group in due:
            _RETRIES.pop(key, None)
    for _key, group in due:
        backend = group.autoscaling_backend
        if backend.autoscaling_groups.get(group.name) is not group:
            continue  # deleted meanwhile
        if len(group.active_instances()) < (group.desired_capacity or 0):
            group.set_desired_capacity(group.desired_capacity)


def is_out(instance_type: str, zone: str) -> bool:
    with _LOCK:
        return (instance_type, "") in _OUT or (instance_type, zone) in _OUT


def _types(group: Any) -> list[str]:
    """The group's types in priority order (its overrides, else the template's type)."""
    policy = group.mixed_instances_policy or {}
    overrides = (policy.get("LaunchTemplate") or {}).get("Overrides") or []
    types = [str(o["InstanceType"]) for o in overrides if o.get("InstanceType")]
    return types or [group.instance_type]


def _zones(group: Any) -> list[tuple[str, str]]:
    """(subnet, zone) of the group's subnets, in order ([("", zone)] without subnets)."""
    subnets = [s for s in (group.vpc_zone_identifier or "").split(",") if s]
    if not subnets:
        return [("", z) for z in group.availability_zones]
    ec2 = group.autoscaling_backend.ec2_backend
    return [(s, ec2.get_subnet(s).availability_zone) for s in subnets]


def ice_message(instance_type: str, zone: str, others: list[str], *, mixed: bool) -> str:
    """EC2's insufficient-capacity text, as an Auto Scaling launch error carries it."""
    text = (f"We currently do not have sufficient {instance_type} capacity in the Availability "
            f"Zone you requested ({zone}). Our system will be working on provisioning "
            f"additional capacity.")
    if others:
        text += (f" You can currently get {instance_type} capacity by not specifying an "
                 f"Availability Zone in your request or choosing {', '.join(others)}.")
    text += " Launching EC2 instance failed."
    return (FLEET_PREFIX + text) if mixed else text


def failed_launch_message(group: Any, instance_type: str, subnet: str, zone: str,
                          status: str) -> dict:
    """The ``EC2_INSTANCE_LAUNCH_ERROR`` notification of one failed launch of ``group``:
    EC2's ``status`` as ``StatusMessage`` (also ``emulator.vcpu_quotas``'s launches over
    the account's vCPU quota)."""
    from emulator import notifications as nt

    message = nt.notification(LAUNCH_ERROR, group.name, desired=group.desired_capacity or 0,
                              instance_type=instance_type)
    message.update({
        "StatusMessage": status,
        "Description": f"Launching a new EC2 instance.  Status Reason: {status}",
        "Details": {"Subnet ID": subnet, "Availability Zone": zone},
        "Cause": (f"At {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} an instance was "
                  f"started in response to a difference between desired and actual capacity, "
                  f"increasing the capacity from {len(group.instance_states)} to "
                  f"{group.desired_capacity}."),
        "ActivityId": str(uuid.uuid4()),
    })
    return message


def _error_notification(group: Any, instance_type: str, subnet: str, zone: str) -> dict:
    ec2 = group.autoscaling_backend.ec2_backend
    region_zones = [z.name for z in ec2.describe_availability_zones()]
    others = [z for z in region_zones if z != zone and not is_out(instance_type, z)]
    status = ice_message(instance_type, zone, others, mixed=len(_types(group)) > 1)
    return failed_launch_message(group, instance_type, subnet, zone, status)


def report_failed_launch(group: Any, message: dict) -> None:
    """A launch of ``group`` failed: publish ``message`` (now, or once the group's
    notification configuration exists) and try again after :data:`RETRY_SECONDS`."""
    scaling_activities.record(group, message)  # DescribeScalingActivities shows it
    _publish_or_keep(group, message)
    _retry_later(group)


def _publish_or_keep(group: Any, message: dict) -> None:
    """Publish now, or (inside CreateAutoScalingGroup) once the configuration exists."""
    from emulator import moto_publishing

    if hasattr(group, "emulator_notifications"):
        moto_publishing.notify_group(group, message)
    else:
        group.__dict__.setdefault("emulator_pending_errors", []).append(message)


def _wrap_replace(original: Any) -> Any:
    def replace_autoscaling_group_instances(self: Any, count_needed: int,
                                            propagated_tags: dict[str, str]) -> None:
        with _LOCK:
            active = bool(_OUT) or _FLAKY["count"] > 0
        if not active:
            original(self, count_needed, propagated_tags)
            return
        types, zones = _types(self), _zones(self)
        for _ in range(count_needed):
            if _take_flaky(self):  # capacity that frees later: this attempt fails
                subnet, zone = zones[0]
                report_failed_launch(self, _error_notification(self, types[0], subnet, zone))
                continue
            choice = next(((subnet, zone, t) for subnet, zone in zones for t in types
                           if not is_out(t, zone)), None)
            if choice is None:  # nothing anywhere: one failed launch
                subnet, zone = zones[0]
                report_failed_launch(self, _error_notification(self, types[-1], subnet, zone))
                continue
            subnet, zone, itype = choice
            before = {s.instance.id for s in self.instance_states}
            saved = self.vpc_zone_identifier
            self.vpc_zone_identifier = subnet or saved
            self.__dict__["emulator_launch_type"] = itype  # whose vCPU quota counts
            try:
                original(self, 1, dict(propagated_tags))
            finally:
                self.vpc_zone_identifier = saved
                self.__dict__.pop("emulator_launch_type", None)
            for state in self.instance_states:
                if state.instance.id not in before:
                    state.instance.instance_type = itype  # what the fallback launched

    return replace_autoscaling_group_instances


def _wrap_update(original: Any) -> Any:
    def update(self: Any, availability_zones: list[str], desired_capacity: int | None,
               max_size: int | None, min_size: int | None, launch_config_name: str,
               launch_template: dict[str, Any], vpc_zone_identifier: str,
               health_check_period: int, health_check_type: str,
               new_instances_protected_from_scale_in: bool | None = None,
               mixed_instances_policy: dict[str, Any] | None = None) -> None:
        if mixed_instances_policy is None and not launch_template and \
                self.mixed_instances_policy:  # AWS keeps what the call does not name
            mixed_instances_policy = copy.deepcopy(self.mixed_instances_policy)
            spec = mixed_instances_policy["LaunchTemplate"]["LaunchTemplateSpecification"]
            if spec.get("LaunchTemplateId"):  # moto stores id AND name, then refuses both
                spec.pop("LaunchTemplateName", None)
        original(self, availability_zones, desired_capacity, max_size, min_size,
                 launch_config_name, launch_template, vpc_zone_identifier, health_check_period,
                 health_check_type, new_instances_protected_from_scale_in,
                 mixed_instances_policy)
        if desired_capacity is None and vpc_zone_identifier:
            self.set_desired_capacity(self.desired_capacity)  # fill up in the new subnets

    return update


def _wrap_group_from_cfn(original: Any) -> Any:
    def create_from_cloudformation_json(cls: Any, *args: Any, **kwargs: Any) -> Any:
        from emulator import moto_publishing

        group = original(*args, **kwargs)
        for message in group.__dict__.pop("emulator_pending_errors", []):
            moto_publishing.notify_group(group, message)
        return group

    return classmethod(create_from_cloudformation_json)


def _placement_group_model() -> type:
    """``AWS::EC2::PlacementGroup`` for moto's CloudFormation: a name, nothing more."""

    def create(resource_name: str, props: dict[str, Any], account_id: str,
               region: str) -> tuple[str, dict[str, str]]:
        name = props.get("GroupName") or f"{resource_name}-{uuid.uuid4().hex[:12]}"
        return name, {"GroupName": name}

    return cfn_model("AWS::EC2::PlacementGroup", name_type="GroupName",
                     attributes=("GroupName",), create=create)


def patches(group_class: Any) -> dict[str, Any]:
    """The patched methods of moto's ``FakeAutoScalingGroup`` (tests apply them with
    monkeypatch so that they are undone)."""
    return {
        "replace_autoscaling_group_instances": _wrap_replace(
            group_class.replace_autoscaling_group_instances),
        "update": _wrap_update(group_class.update),
        "create_from_cloudformation_json": _wrap_group_from_cfn(
            group_class.create_from_cloudformation_json),
    }


def install() -> None:
    """Patch moto's Auto Scaling group model (after ``moto_extensions`` patched it)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.autoscaling.models import FakeAutoScalingGroup
    from moto.cloudformation import parsing

    for name, method in patches(FakeAutoScalingGroup).items():
        setattr(FakeAutoScalingGroup, name, method)
    scaling_activities.install()  # the failed launches in DescribeScalingActivities
    _placement_group_model()  # a CloudFormationModel subclass: moto's model list finds it
    for cached in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cached.cache_clear()
    _INSTALLED = True

"""EC2's vCPU quotas enforced at launch, as AWS enforces them.

EC2 counts the vCPUs of an account's running On-Demand instances per instance class (one
quota each: Standard A, C, D, H, I, M, R, T, Z; G and VT; P; Inf; Trn) and refuses a launch
that would take the class above the account's applied quota with ``VcpuLimitExceeded``
("You have requested more vCPU capacity than your current vCPU limit of N allows for the
instance bucket that the specified instance type belongs to. Please visit
http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.");
Spot instances count against the class's Spot quota instead
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-on-demand-instances.html#ec2-on-demand-instances-limits,
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html). moto launches
any count. Here, in the emulator's moto server:

- RunInstances (the API call, and every launch moto makes for an Auto Scaling group; not
  the instances moto's EMR launches for RunJobFlow) is refused
  with that error when the pending and running instances of the new instances' quota class
  and market, plus the new ones, exceed the value ``emulator.service_quotas`` answers for
  GetServiceQuota in that account and region (the default, or an approved increase). The
  class comes from :data:`emulator.service_quotas.FAMILY_QUOTAS`; a family without a quota
  there, an instance type moto does not describe, and a Capacity Block launch (market type
  ``capacity-block``: the block is paid capacity, not the On-Demand quota) are not checked.
  An instance is Spot when RunInstances or its launch template asks for the ``spot``
  market; moto launches every Auto Scaling group instance On-Demand (docs/emulator.md);
- an Auto Scaling group launches its instances one by one, so a group whose launch is
  partly over the quota gets the instances that fit (as on AWS, where a group stops short
  of its desired capacity at the limit). Each refused launch is a failed launch activity:
  ``autoscaling:EC2_INSTANCE_LAUNCH_ERROR`` with EC2's message and "Launching EC2 instance
  failed." as ``StatusMessage`` (a mixed instances group, an EC2 Fleet launch, prefixes
  "Could not launch On-Demand Instances. VcpuLimitExceeded - "), and the group tries
  again, as it does after any failed launch (``emulator.capacity.report_failed_launch``):
  a quota raised meanwhile lets the retry through.
"""

from __future__ import annotations

import contextvars
from typing import Any

from emulator import capacity, service_quotas

LIMIT_TEXT = ("You have requested more vCPU capacity than your current vCPU limit of {limit} "
              "allows for the instance bucket that the specified instance type belongs to. "
              "Please visit http://aws.amazon.com/contact-us/ec2-request to request an "
              "adjustment to this limit.")
FLEET_PREFIX = "Could not launch On-Demand Instances. VcpuLimitExceeded - "
#: The instance states that count against a quota (pending and running).
COUNTED_STATES = ("pending", "running")
SPOT, CAPACITY_BLOCK = "spot", "capacity-block"

_INSTALLED = False
#: Set while EC2's RunInstances API call runs: the launches EC2 checks here are that call's
#: and the groups' (EMR's RunJobFlow also launches through moto's EC2 backend; on AWS its
#: quota failure is the cluster's state change reason, not the API call's error).
_RUN_INSTANCES_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "run_instances_call", default=False)


def _error_class() -> type:
    from moto.ec2.exceptions import EC2ClientError

    class VcpuLimitExceeded(EC2ClientError):
        """EC2's refusal of a launch above the account's vCPU quota."""

        def __init__(self, limit: float) -> None:
            super().__init__("VcpuLimitExceeded", LIMIT_TEXT.format(limit=f"{limit:g}"))
            self.limit = limit

    return VcpuLimitExceeded


_ERROR: type | None = None


def error_class() -> type:
    """The ``VcpuLimitExceeded`` exception (a moto EC2 client error: RunInstances answers
    it with EC2's code and message)."""
    global _ERROR
    if _ERROR is None:
        _ERROR = _error_class()
    return _ERROR


def vcpus(instance_type: str) -> int:
    """An instance type's default vCPUs (EC2 DescribeInstanceTypes); 0 when moto does not
    describe the type (not checked)."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    return int((INSTANCE_TYPES.get(instance_type) or {}).get("VCpuInfo", {})
               .get("DefaultVCpus", 0))


def market_of(backend: Any, kwargs: dict[str, Any]) -> str:
    """The market a RunInstances asks for ("" On-Demand, ``spot``, ``capacity-block``):
    its ``InstanceMarketOptions``, else its launch template's."""
    market = kwargs.get("instance_market_options")
    if isinstance(market, dict):
        market = market.get("MarketType", SPOT if market else "")
    if not market and kwargs.get("launch_template"):
        data = backend._get_template_from_args(kwargs["launch_template"]).data
        market = (data.get("InstanceMarketOptions") or {}).get("MarketType", "")
    return str(market or "")


def _instance_market(instance: Any) -> str:
    return getattr(instance, "emulator_market",
                   SPOT if getattr(instance, "lifecycle", None) == SPOT else "")


def usage(backend: Any, code: str) -> int:
    """vCPUs of the account's pending and running instances that count against ``code``."""
    total = 0
    for reservation in backend.reservations.values():
        for instance in reservation.instances:
            market = _instance_market(instance)
            if instance.state not in COUNTED_STATES or market == CAPACITY_BLOCK:
                continue
            if service_quotas.quota_code(instance.instance_type, spot=market == SPOT) == code:
                total += vcpus(instance.instance_type)
    return total


def check(backend: Any, instance_type: str, count: int, market: str) -> None:
    """Refuse (``VcpuLimitExceeded``) ``count`` new instances of ``instance_type`` that would
    take their quota class above the account's applied quota."""
    code = service_quotas.quota_code(instance_type, spot=market == SPOT)
    need = count * vcpus(instance_type)
    if market == CAPACITY_BLOCK or code is None or need == 0:
        return
    limit = service_quotas.applied_value(backend.account_id, backend.region_name, code)
    if usage(backend, code) + need > limit:
        raise error_class()(limit)


def _wrap_run_instances(original: Any) -> Any:
    def run_instances(self: Any, image_id: str, count: int, user_data: Any,
                      security_group_names: list[str], **kwargs: Any) -> Any:
        market = market_of(self, kwargs)
        itype = kwargs.get("instance_type") or ""
        if kwargs.get("launch_template") and kwargs.get("is_instance_type_default"):
            data = self._get_template_from_args(kwargs["launch_template"]).data
            itype = data.get("InstanceType") or itype
        if _RUN_INSTANCES_CALL.get():  # a group's launch is checked by its launcher
            check(self, itype, int(count), market)
        reservation = original(self, image_id, count, user_data, security_group_names,
                               **kwargs)
        for instance in reservation.instances:
            instance.emulator_market = market
        return reservation

    return run_instances


def _wrap_api_call(original: Any) -> Any:
    def run_instances(self: Any) -> Any:
        token = _RUN_INSTANCES_CALL.set(True)
        try:
            return original(self)
        finally:
            _RUN_INSTANCES_CALL.reset(token)

    return run_instances


def group_status(group: Any, error: Exception) -> str:
    """The ``StatusMessage`` of a group's launch that EC2 refused with ``error``."""
    status = f"{getattr(error, 'message', str(error))} Launching EC2 instance failed."
    return FLEET_PREFIX + status if group.mixed_instances_policy else status


def _first_zone(group: Any) -> tuple[str, str]:
    """(subnet, zone) where moto launches the group's next instance."""
    subnets = [s for s in (group.vpc_zone_identifier or "").split(",") if s]
    if not subnets:
        return "", (group.availability_zones or [""])[0]
    ec2 = group.autoscaling_backend.ec2_backend
    return subnets[0], ec2.get_subnet(subnets[0]).availability_zone


def _wrap_group_launch(original: Any) -> Any:
    def replace_autoscaling_group_instances(self: Any, count_needed: int,
                                            propagated_tags: dict[str, str]) -> None:
        ec2 = self.autoscaling_backend.ec2_backend
        template = ({"LaunchTemplateId": self.ec2_launch_template.id}
                    if self.ec2_launch_template else None)
        for _ in range(count_needed):  # one by one: the instances that fit launch
            itype = self.__dict__.get("emulator_launch_type") or self.instance_type
            try:
                # the type it launches: moto's RunInstances sees the template's type, not the
                # emulator.capacity fallback type the instance becomes
                check(ec2, itype, 1, market_of(ec2, {"launch_template": template}))
                original(self, 1, dict(propagated_tags))
            except error_class() as exc:
                subnet, zone = _first_zone(self)
                capacity.report_failed_launch(self, capacity.failed_launch_message(
                    self, itype, subnet, zone, group_status(self, exc)))

    return replace_autoscaling_group_instances


def patches(group_class: Any, backend_class: Any) -> dict[tuple[Any, str], Any]:
    """The patched methods ((class, name) -> method): moto's own group launcher, EC2's
    RunInstances call and its backend (tests apply them with monkeypatch so that they are
    undone)."""
    from moto.ec2.responses.instances import InstanceResponse

    return {
        (group_class, "replace_autoscaling_group_instances"): _wrap_group_launch(
            group_class.replace_autoscaling_group_instances),
        (backend_class, "run_instances"): _wrap_run_instances(backend_class.run_instances),
        (InstanceResponse, "run_instances"): _wrap_api_call(InstanceResponse.run_instances),
    }


def install() -> None:
    """Patch moto (before ``emulator.moto_extensions`` wraps the group's launcher, so that
    this wrapper is the innermost: a refused launch never reaches the launch notification)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.autoscaling.models import FakeAutoScalingGroup
    from moto.ec2.models.instances import InstanceBackend

    for (cls, name), method in patches(FakeAutoScalingGroup, InstanceBackend).items():
        setattr(cls, name, method)
    _INSTALLED = True

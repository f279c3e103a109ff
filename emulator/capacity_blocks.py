"""Capacity Blocks for ML in the emulator: DescribeCapacityReservations and the schedules that
act before a block ends (part of ``emulator.moto_extensions``, which calls :func:`install`).

moto 5.2 has no Capacity Reservations: DescribeCapacityReservations is not an action it
knows, so the stack's ``Custom::CapacityBlockEnd`` could not read a block's end time, and a
missing block could not be refused as EC2 refuses it. Here, in the emulator's moto server:

- :func:`purchase_block` leaves what PurchaseCapacityBlock leaves in an account
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-purchase.html): a
  targeted Capacity Reservation of ``ReservationType`` ``capacity-block`` in one zone, with
  a start and an end date. Offerings (DescribeCapacityBlockOfferings) are not played: a
  test or the demo buys the block it needs directly.
- DescribeCapacityReservations answers the account's reservations by id, each with its
  ``State`` computed from the clock as EC2 shows it (``scheduled`` before the start,
  ``active`` until the end, ``expired`` after,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-view.html); an id
  the account does not have is refused with ``InvalidCapacityReservationId.NotFound``.
- ``AWS::Scheduler::Schedule`` in moto's CloudFormation (moto skips the type): created and
  deleted on moto's own EventBridge Scheduler backend, so GetSchedule / ListSchedules show
  the stack's schedules as on AWS. A schedule never fires here (moto runs no scheduler),
  and no instance in a block is terminated at its end: docs/emulator.md says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
from typing import Any

from emulator.cfn_model import cfn_model

NOT_FOUND = "InvalidCapacityReservationId.NotFound"
_INSTALLED = False


def _reservations(backend: Any) -> dict[str, dict[str, Any]]:
    """The account's reservations in one region (moto's reset replaces the backend)."""
    if not hasattr(backend, "_dl_capacity_reservations"):
        backend._dl_capacity_reservations = {}
    return backend._dl_capacity_reservations


def purchase_block(account: str, region: str, *, instance_type: str, count: int, zone: str,
                   start: dt.datetime, end: dt.datetime) -> str:
    """A Capacity Block bought in ``account``/``region``; returns its id (``cr-``...)."""
    from moto.ec2.models import ec2_backends

    block_id = "cr-" + secrets.token_hex(9)[:17]
    _reservations(ec2_backends[account][region])[block_id] = {
        "CapacityReservationId": block_id, "OwnerId": account,
        "CapacityReservationArn":
            f"arn:aws:ec2:{region}:{account}:capacity-reservation/{block_id}",
        "InstanceType": instance_type, "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": zone, "Tenancy": "default", "TotalInstanceCount": count,
        "AvailableInstanceCount": count, "EbsOptimized": True, "EphemeralStorage": False,
        "StartDate": start, "EndDate": end, "EndDateType": "limited",
        "InstanceMatchCriteria": "targeted", "CreateDate": dt.datetime.now(dt.UTC),
        "ReservationType": "capacity-block", "CapacityBlockId": block_id, "Tags": []}
    return block_id


def _state(block: dict[str, Any], now: dt.datetime) -> str:
    if now < block["StartDate"]:
        return "scheduled"
    return "active" if now < block["EndDate"] else "expired"


def _describe_capacity_reservations(self: Any) -> Any:
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError

    wanted = self._get_param("CapacityReservationIds", []) or []
    known = _reservations(self.ec2_backend)
    for block_id in wanted:
        if block_id not in known:
            raise EC2ClientError(NOT_FOUND, f"The capacity reservation ID '{block_id}' does "
                                 f"not exist")
    now = dt.datetime.now(dt.UTC)
    found = [{**b, "State": _state(b, now)} for i, b in known.items()
             if not wanted or i in wanted]
    return ActionResult({"CapacityReservations": found})


# -- AWS::Scheduler::Schedule ---------------------------------------------------------------


def _schedule_model() -> type:
    from moto.scheduler.models import scheduler_backends

    def create(resource_name: str, p: dict[str, Any], account: str,
               region: str) -> tuple[str, dict[str, Any]]:
        name = str(p.get("Name") or resource_name)
        schedule = scheduler_backends[account][region].create_schedule(
            description=p.get("Description", ""), end_date=p.get("EndDate"),
            flexible_time_window=p.get("FlexibleTimeWindow", {"Mode": "OFF"}),
            group_name=p.get("GroupName", ""), kms_key_arn=p.get("KmsKeyArn", ""),
            name=name, schedule_expression=p["ScheduleExpression"],
            schedule_expression_timezone=p.get("ScheduleExpressionTimezone", "UTC"),
            start_date=p.get("StartDate"), state=p.get("State", "ENABLED"),
            target=p["Target"], action_after_completion=p.get("ActionAfterCompletion"))
        return name, {"Arn": schedule.arn}

    def delete(resource_name: str, p: dict[str, Any], account: str, region: str) -> None:
        from moto.scheduler.exceptions import ScheduleNotFound

        name = p.get("Name") if isinstance(p.get("Name"), str) else resource_name
        with contextlib.suppress(ScheduleNotFound):
            scheduler_backends[account][region].delete_schedule(p.get("GroupName"), name)

    return cfn_model("AWS::Scheduler::Schedule", create=create, delete=delete,
                     name_type="Name", attributes=("Arn",))


def install() -> None:
    """Patch moto's EC2 responses and CloudFormation models in this process (idempotent);
    the caller clears moto's CloudFormation model caches afterwards."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.ec2.responses import EC2Response

    EC2Response.describe_capacity_reservations = (  # type: ignore[attr-defined]
        _describe_capacity_reservations)
    _schedule_model()
    _INSTALLED = True

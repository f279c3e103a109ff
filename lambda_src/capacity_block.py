"""A Capacity Block's end: read at deploy time, and the nodes released before EC2 takes them.

Why: EC2 begins terminating every instance still running in a Capacity Block for ML 30
minutes before the block's end time
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html; its
"Capacity Block Expiration Warning" EventBridge event comes 10 minutes before that,
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html). Such a
termination goes through no lifecycle hook of ours: the running job's ranks get no SIGTERM
from the executor, and the last steps since its last save are lost. The stack knows only the
block's id (``capacityBlockId``), so:

1. ``Custom::CapacityBlockEnd`` (Create and Update, before either group launches) reads the
   block (EC2 DescribeCapacityReservations) and answers FAILED, naming the block, when it is
   missing, is not a Capacity Block (``ReservationType`` ``capacity-block``), cannot run
   (expired, cancelled, payment failed), or ends so soon that its nodes would leave less
   than :data:`MIN_USEFUL_MINUTES` from now. Otherwise its attributes are the times the
   stack's two EventBridge Scheduler schedules fire (``at(...)`` in UTC): the workers leave
   ``LeadMinutes`` before the end, the master :data:`MASTER_AFTER_WORKERS_MINUTES` later
   (it completes the workers' drain lifecycle actions, so it stays until they are done).
2. Each schedule invokes the capacity adjuster's function with :func:`scheduled_input`;
   :func:`release_at_end` lifts scale-in protection from the group's instances and sets the
   group's minimum, maximum and desired capacity to 0 (``cluster_release.release``, the
   stack deletion's own step). A worker leaves through the drain hook like any scale-in:
   its executor stops every share with SIGTERM, the job's grace, then SIGKILL
   (the executor's ``jobs/executor/drain.py``), which is the product's one way of asking
   a job to checkpoint and stop; a maximum of 0 keeps the idle stop's resume, ``dl-scale``
   and the capacity adjuster from launching into a block about to end.

Delete does nothing (the schedules are the stack's resources and go with it).

Properties: ``CapacityBlockId``, ``LeadMinutes``. Attributes: ``EndDate``,
``TerminationsBeginAt``, ``WorkersStopAt``, ``MasterStopAt`` (``YYYY-MM-DDTHH:MM:SS``, UTC).
Permissions: ``ec2:DescribeCapacityReservations`` (no resource-level permissions, Service
Authorization Reference); the release uses the grants of ``Custom::ClusterRelease``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

try:  # imported as lambda_src.capacity_block (tests, installed package)
    from . import cfn_response, cluster_release
except ImportError:  # imported as capacity_block (Lambda: the asset root is on sys.path)
    import cfn_response  # type: ignore[no-redef]
    import cluster_release  # type: ignore[no-redef]

RESOURCE_TYPE = "Custom::CapacityBlockEnd"
#: EC2 begins terminating a block's instances this long before its end time.
TERMINATION_LEAD_MINUTES = 30
#: The master leaves this long after the workers: a drain takes at most the drain hook's
#: 300 s heartbeat (``DRAIN_HEARTBEAT_SECONDS``), and the master completes it.
MASTER_AFTER_WORKERS_MINUTES = 10
#: A deploy whose workers would leave sooner than this is refused: the nodes' boot and the
#: setup wait alone take about that long, so no job would run.
MIN_USEFUL_MINUTES = 30
#: States in which a block will run instances (payment pending turns scheduled or fails).
USABLE_STATES = ("active", "scheduled", "payment-pending")
#: The scheduled invocation's key (the EventBridge Scheduler target's fixed input).
SCHEDULED_KEY = "CapacityBlockEnd"
#: The ``at()`` time format of EventBridge Scheduler (with ``ScheduleExpressionTimezone``).
AT_FORMAT = "%Y-%m-%dT%H:%M:%S"


class BlockRefused(ValueError):
    """The block cannot carry this cluster; the message says why and what to do."""


def stop_times(end: dt.datetime, lead_minutes: int) -> tuple[dt.datetime, dt.datetime]:
    """(workers leave, master leaves) for a block ending at ``end``."""
    workers = end - dt.timedelta(minutes=lead_minutes)
    return workers, workers + dt.timedelta(minutes=MASTER_AFTER_WORKERS_MINUTES)


def check(block_id: str, block: dict[str, Any] | None, lead_minutes: int,
          now: dt.datetime) -> dict[str, str]:
    """The resource's attributes for ``block`` (DescribeCapacityReservations' entry, None
    when EC2 has none), or BlockRefused. Pure."""
    if block is None:
        raise BlockRefused(
            f"Capacity Block {block_id} does not exist in this account and region "
            f"(aws ec2 describe-capacity-reservations --capacity-reservation-ids {block_id})")
    kind = block.get("ReservationType", "default")
    if kind != "capacity-block":
        raise BlockRefused(
            f"{block_id} is a Capacity Reservation of type {kind!r}, not a Capacity Block for "
            f"ML: give it as capacityReservationId instead of capacityBlockId")
    state = str(block.get("State", ""))
    if state not in USABLE_STATES:
        raise BlockRefused(f"Capacity Block {block_id} is {state!r}: it runs no instance "
                           f"(usable: {', '.join(USABLE_STATES)})")
    end = block.get("EndDate")
    if not isinstance(end, dt.datetime):
        raise BlockRefused(f"Capacity Block {block_id} has no EndDate")
    end = end.astimezone(dt.UTC)
    workers, master = stop_times(end, lead_minutes)
    left = (workers - now).total_seconds() / 60
    if left < MIN_USEFUL_MINUTES:
        raise BlockRefused(
            f"Capacity Block {block_id} ends at {end:%Y-%m-%d %H:%M} UTC: the cluster's "
            f"workers would leave at {workers:%Y-%m-%d %H:%M} UTC ({lead_minutes} min before "
            f"the end, capacityBlockLeadMinutes), {left:.0f} min from now, less than the "
            f"{MIN_USEFUL_MINUTES} min a cluster needs to boot and run a job")
    return {"EndDate": end.strftime(AT_FORMAT),
            "TerminationsBeginAt": (end - dt.timedelta(minutes=TERMINATION_LEAD_MINUTES))
            .strftime(AT_FORMAT),
            "WorkersStopAt": workers.strftime(AT_FORMAT),
            "MasterStopAt": master.strftime(AT_FORMAT)}


def describe(ec2: Any, block_id: str) -> dict[str, Any] | None:
    """The block as EC2 describes it; None when EC2 says there is no such id."""
    from botocore.exceptions import ClientError

    try:
        found = ec2.describe_capacity_reservations(
            CapacityReservationIds=[block_id])["CapacityReservations"]
    except ClientError as exc:
        if "NotFound" in exc.response.get("Error", {}).get("Code", ""):
            return None
        raise
    return next((b for b in found if b.get("CapacityReservationId") == block_id), None)


def _properties(event: dict[str, Any]) -> tuple[str, int]:
    props = event.get("ResourceProperties") or {}
    block_id, lead = props.get("CapacityBlockId"), props.get("LeadMinutes")
    if not isinstance(block_id, str) or not block_id.startswith("cr-"):
        raise ValueError(f"ResourceProperties.CapacityBlockId must be a cr- id, got "
                         f"{block_id!r}")
    try:  # CloudFormation passes every scalar as a string
        minutes = int(str(lead))
    except ValueError:
        raise ValueError(f"ResourceProperties.LeadMinutes must be a whole number, got "
                         f"{lead!r}") from None
    if minutes < TERMINATION_LEAD_MINUTES + MASTER_AFTER_WORKERS_MINUTES:
        raise ValueError(f"LeadMinutes {minutes} leaves the master past EC2's terminations")
    return block_id, minutes


def respond(event: dict[str, Any], ec2: Any, *,
            now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
            ) -> dict[str, Any]:
    """The response object for one request; never raises."""
    kind = event.get("RequestType")
    answer = cfn_response.body(event)
    if kind == "Delete":
        return answer
    try:
        block_id, lead = _properties(event)
        data = check(block_id, describe(ec2, block_id), lead, now())
    except BlockRefused as exc:
        return cfn_response.body(event, "FAILED", f"{RESOURCE_TYPE}: {exc}")
    except Exception as exc:
        return cfn_response.body(event, "FAILED",
                                 f"{RESOURCE_TYPE}: {type(exc).__name__}: {exc}")
    answer["PhysicalResourceId"] = block_id
    answer["Data"] = data
    answer["Reason"] = (f"{block_id} ends {data['EndDate']} UTC: workers leave "
                        f"{data['WorkersStopAt']}, the master {data['MasterStopAt']} UTC")
    return answer


# -- the scheduled release ------------------------------------------------------------------


def scheduled_input(block_id: str, group: str) -> dict[str, Any]:
    """What a schedule sends the function: the block and one group to release."""
    return {SCHEDULED_KEY: {"CapacityBlockId": block_id, "Group": group}}


def is_scheduled(event: Any) -> bool:
    return isinstance(event, dict) and isinstance(event.get(SCHEDULED_KEY), dict)


def release_at_end(event: dict[str, Any], autoscaling: Any, *,
                   sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Release the group a schedule names (protection lifted, sizes to 0). Raises on a
    malformed event or a failed call: the asynchronous invocation is retried by Lambda."""
    body = event[SCHEDULED_KEY]
    group = body.get("Group")
    if not isinstance(group, str) or not group:
        raise ValueError(f"{SCHEDULED_KEY}.Group must name a group, got {group!r}")
    released = cluster_release.release(autoscaling, [group], sleep=sleep)
    return {"capacity_block": str(body.get("CapacityBlockId", "")), "group": group,
            "unprotected": released}

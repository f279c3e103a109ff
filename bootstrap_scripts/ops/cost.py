"""A job's cost: node-seconds of each attempt times each node's hourly price (pure, no I/O).

The job controller records, for every attempt of a managed job, when it started and ended
and each of its nodes with the price it was bought at (``AttemptUsage`` / ``NodeUsage`` in
``managed/<id>/job.json``; the prices come from ``ops/prices.py``, the AWS side). Everything
here is arithmetic on those records, so the ledger, ``dl-jobs``, ``dlc jobs`` and the
``--max-cost`` cap agree to the cent and are tested as tables.

How a node is priced, by how its instance was bought (DescribeInstances'
``InstanceLifecycle`` and ``CapacityReservationId``,
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Instance.html):

- ``on-demand``: the Price List's On-Demand hourly rate for Linux, shared tenancy
  (https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/reading-an-offer.html);
- ``reservation``: an On-Demand Capacity Reservation is billed at the On-Demand rate whether
  instances run in it or not, and an instance running in it is not billed again
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-pricing-billing.html):
  the node's share is the On-Demand rate;
- ``spot``: the Spot price in effect in the instance's Availability Zone when the attempt
  started (DescribeSpotPriceHistory; Spot is billed at the price in effect, by the second,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-instances-history.html);
- ``capacity-block``: a Capacity Block for ML is paid up front when it is bought; its
  instances are not billed again while they run
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-pricing-billing.html).
  The ledger charges a job the block's hourly rate (the Price List's ``CapacityBlock`` market
  option for the type) for the node-seconds it used: what the job took of what was paid. A
  block's price is set by supply and demand when it is bought and never changes after, so
  the Price List's rate of today is an estimate of what that block cost.

EC2 bills Linux instances per second (with a one-minute minimum per instance launch, which
belongs to the instance, not to a job): a node's cost is its seconds x its hourly rate / 3600.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from bootstrap_scripts.protocol.managed_records import AttemptUsage, NodeUsage

#: The largest --max-cost accepted (a typo's extra zeros are refused, not obeyed).
MAX_CAP_USD = Decimal("1000000")
CENT = Decimal("0.01")


class Market(StrEnum):
    """How a node's instance was bought (what decides its price)."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    RESERVATION = "reservation"
    CAPACITY_BLOCK = "capacity-block"

    @property
    def price_list_option(self) -> str:
        """The Price List's ``marketoption`` attribute that holds this market's hourly rate
        (Spot prices are not in the Price List)."""
        return "CapacityBlock" if self is Market.CAPACITY_BLOCK else "OnDemand"


@dataclass(frozen=True)
class Purchase:
    """One instance's purchase option and zone, from its DescribeInstances entry."""

    instance_id: str
    market: Market
    zone: str = ""


def purchase_of(instance: Mapping[str, Any]) -> Purchase:
    """How a DescribeInstances instance was bought: ``InstanceLifecycle`` ``spot`` or
    ``capacity-block``, else a ``CapacityReservationId`` (an On-Demand Capacity
    Reservation), else On-Demand."""
    lifecycle = str(instance.get("InstanceLifecycle") or "")
    if lifecycle == "spot":
        market = Market.SPOT
    elif lifecycle == "capacity-block":
        market = Market.CAPACITY_BLOCK
    elif instance.get("CapacityReservationId"):
        market = Market.RESERVATION
    else:
        market = Market.ON_DEMAND
    zone = str((instance.get("Placement") or {}).get("AvailabilityZone") or "")
    return Purchase(str(instance.get("InstanceId", "")), market, zone)


def hourly_from_price_list(price_list: Iterable[str]) -> Decimal | None:
    """The hourly USD rate of the first product of a GetProducts ``PriceList`` (JSON
    strings) that has a positive hourly price dimension; None when none has."""
    for text in price_list:
        try:
            product = json.loads(text)
        except ValueError:
            continue
        for terms in (product.get("terms") or {}).values():
            for term in (terms or {}).values():
                for dim in (term.get("priceDimensions") or {}).values():
                    if dim.get("unit") not in ("Hrs", "Hours"):
                        continue
                    try:
                        value = Decimal(str((dim.get("pricePerUnit") or {}).get("USD", "")))
                    except InvalidOperation:
                        continue
                    if value > 0:
                        return value
    return None


def spot_price_at(history: Iterable[Mapping[str, Any]], at: float) -> Decimal | None:
    """The Spot price in effect at ``at`` (epoch seconds): the newest DescribeSpotPriceHistory
    entry (``{"Timestamp": epoch seconds, "SpotPrice": "0.3"}``) at or before ``at``, else
    the oldest one after it (the history starts later than the attempt); None if empty."""
    entries = []
    for entry in history:
        try:
            entries.append((float(entry["Timestamp"]), Decimal(str(entry["SpotPrice"]))))
        except (KeyError, TypeError, ValueError, InvalidOperation):
            continue
    if not entries:
        return None
    before = [e for e in entries if e[0] <= at]
    return max(before)[1] if before else min(entries)[1]


def parse_usd(text: str, *, what: str = "--max-cost") -> Decimal:
    """A USD amount given by a user: positive, at most :data:`MAX_CAP_USD`, cents at most.
    ValueError naming ``what`` and the value."""
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        raise ValueError(f"{what} must be an amount in USD such as 12.50, got {text!r}") from None
    if not value.is_finite() or value <= 0:
        raise ValueError(f"{what} must be more than 0 USD, got {text!r}")
    if value > MAX_CAP_USD:
        raise ValueError(f"{what} must be at most {MAX_CAP_USD} USD, got {text!r}")
    if value != value.quantize(CENT):
        raise ValueError(f"{what} is in USD with at most 2 decimals (cents), got {text!r}")
    return value


def plain(value: Decimal) -> str:
    """``value`` exactly, without trailing zeros (what records and ``--json`` carry)."""
    text = format(value.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def usd(value: Decimal | None) -> str:
    """For people: ``12.35`` (rounded to the cent, half up), or ``unknown``."""
    if value is None:
        return "unknown"
    from decimal import ROUND_HALF_UP

    return str(value.quantize(CENT, rounding=ROUND_HALF_UP))


def unpriced(instance_id: str, instance_type: str, why: str) -> NodeUsage:
    """A node recorded without a price, saying why."""
    return NodeUsage(instance_id=instance_id, instance_type=instance_type, price_note=why)


def node_span(usage: AttemptUsage, node: NodeUsage, now: float) -> float:
    """Seconds ``node`` was one of the attempt's nodes: from the attempt's start or when it
    joined, to the attempt's end (``now`` while it runs) or when it was lost."""
    end = usage.ended_at if usage.ended_at is not None else now
    if node.left_at is not None:
        end = min(end, node.left_at)
    start = max(usage.started_at, node.joined_at or usage.started_at)
    return max(0.0, end - start)


def node_seconds(usage: AttemptUsage, now: float) -> float:
    """Seconds the attempt's nodes ran, summed (a running attempt counts up to ``now``)."""
    return sum(node_span(usage, node, now) for node in usage.nodes)


def node_cost(seconds: float, node: NodeUsage) -> Decimal | None:
    """One node's cost for ``seconds`` at its recorded hourly rate; None when unknown."""
    if not node.usd_per_hour:
        return None
    return Decimal(node.usd_per_hour) * Decimal(repr(max(0.0, seconds))) / Decimal(3600)


@dataclass(frozen=True)
class Cost:
    """A job's ledger: ``usd`` None when a node's price is unknown (``unknown`` says which
    and why); ``by_attempt`` the same per attempt (attempt number, USD or None)."""

    usd: Decimal | None
    node_seconds: float
    unknown: tuple[str, ...] = ()
    by_attempt: tuple[tuple[int, Decimal | None], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"usd": plain(self.usd) if self.usd is not None else "unknown",
                "node_seconds": round(self.node_seconds, 1),
                "unknown": list(self.unknown),
                "by_attempt": [{"attempt": n, "usd": plain(c) if c is not None else "unknown"}
                               for n, c in self.by_attempt]}


def job_cost(usages: Iterable[AttemptUsage], now: float) -> Cost:
    """The ledger of a job's attempts at ``now``."""
    total: Decimal | None = Decimal(0)
    seconds = 0.0
    unknown: list[str] = []
    per: list[tuple[int, Decimal | None]] = []
    for usage in usages:
        seconds += node_seconds(usage, now)
        attempt: Decimal | None = Decimal(0)
        for node in usage.nodes:
            c = node_cost(node_span(usage, node, now), node)
            if c is None:
                attempt = None
                why = f"{node.instance_id} ({node.instance_type}, {node.market or '?'})"
                why += f": {node.price_note}" if node.price_note else ""
                if why not in unknown:
                    unknown.append(why)
            elif attempt is not None:
                attempt += c
        per.append((usage.attempt, attempt))
        total = total + attempt if total is not None and attempt is not None else None
    return Cost(total, seconds, tuple(unknown), tuple(per))


class CapVerdict(StrEnum):
    UNDER = "under"
    REACHED = "reached"
    UNKNOWN = "unknown"  # a node's price is unknown: the cap cannot be kept


def check_cap(cost: Cost, cap: Decimal | None) -> CapVerdict:
    """Whether a job with ``--max-cost cap`` must stop: at or past the cap, or priced
    unknown (a cap that cannot be counted is not kept by running on)."""
    if cap is None:
        return CapVerdict.UNDER
    if cost.usd is None:
        return CapVerdict.UNKNOWN
    return CapVerdict.REACHED if cost.usd >= cap else CapVerdict.UNDER


def cap_message(verdict: CapVerdict, cost: Cost, cap: Decimal) -> str:
    """The job's final message when the cap stopped it."""
    if verdict is CapVerdict.UNKNOWN:
        return (f"stopped: --max-cost {usd(cap)} USD cannot be kept, a node's price is "
                f"unknown ({'; '.join(cost.unknown)})")
    return (f"stopped at the cost cap: {usd(cost.usd)} USD spent of --max-cost {usd(cap)} "
            f"USD ({cost.node_seconds / 3600:.2f} node-hours)")

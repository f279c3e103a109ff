"""The hourly cost of the running instances, from the AWS Price List API.

One ``GetProducts`` per instance type and region (Linux, shared tenancy, no pre-installed
software, on-demand terms; https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/using-price-list-query-api.html),
cached on disk under ``~/.cache/dlc`` for a week (prices change rarely). A price that cannot
be had (no permission, no answer, an emulator without the Price List API) is reported as
unknown with the reason, never guessed. Spot instances are priced on demand: the estimate is
an upper bound for them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from dlc import aws
from dlc.errors import DlcError
from dlc.target import Target

CACHE_SECONDS = 7 * 24 * 3600
#: A price that could not be had is asked for again after this long (not at every status).
UNKNOWN_CACHE_SECONDS = 600


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dlc"


@dataclass
class Price:
    instance_type: str
    usd_per_hour: Decimal | None
    reason: str = ""  # why it is unknown


def parse_on_demand(price_list: list[str]) -> Decimal | None:
    """The hourly USD price of the on-demand term of the first product that has one."""
    for text in price_list:
        try:
            product = json.loads(text)
        except ValueError:
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                if dim.get("unit") not in ("Hrs", "Hours"):
                    continue
                try:
                    value = Decimal(dim.get("pricePerUnit", {}).get("USD", ""))
                except InvalidOperation:
                    continue
                if value > 0:
                    return value
    return None


def _cache_key(target: Target, instance_type: str, region: str) -> str:
    return f"{target.endpoint or 'aws'}|{region}|{instance_type}"


def price(target: Target, instance_type: str, region: str, *,
          cache: Path | None = None, now: float | None = None) -> Price:
    """The on-demand hourly price of ``instance_type`` in ``region`` (cached)."""
    path = (cache or cache_dir()) / "prices.json"
    now = time.time() if now is None else now
    key = _cache_key(target, instance_type, region)
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        entries = {}
    hit = entries.get(key) or {}
    age = now - hit.get("at", 0)
    if hit.get("usd_per_hour") and age < CACHE_SECONDS:
        return Price(instance_type, Decimal(hit["usd_per_hour"]))
    if hit.get("unknown") and age < UNKNOWN_CACHE_SECONDS:
        return Price(instance_type, None, f"{hit['unknown']} (asked {age:.0f} s ago; asked "
                                          f"again after {UNKNOWN_CACHE_SECONDS} s)")
    try:
        value = parse_on_demand(aws.on_demand_products(target, instance_type, region))
        reason = "" if value is not None else (f"the Price List has no on-demand Linux price "
                                               f"for {instance_type} in {region}")
    except DlcError as exc:
        value, reason = None, str(exc)
    entries[key] = ({"usd_per_hour": str(value), "at": now} if value is not None
                    else {"unknown": reason, "at": now})
    _save(path, entries)
    return Price(instance_type, value, reason)


def _save(path: Path, entries: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: no cache, same answer


def plain(value: Decimal) -> str:
    """``value`` without the Price List's trailing zeros (``1.0060000000`` -> ``1.006``), exact:
    what ``--json`` carries."""
    text = format(value.normalize(), "f")
    return text if "." not in text else text.rstrip("0").rstrip(".") or "0"


def usd(value: str) -> str:
    """A price for people: cents always, up to a tenth of a cent (``1.006``, ``12.50``)."""
    if value == "unknown":
        return value
    amount = Decimal(value).quantize(Decimal("0.001"))
    text = format(amount, "f").rstrip("0")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"


def estimate(target: Target, instance_types: list[str], region: str,
             cache: Path | None = None) -> dict:
    """``{"usd_per_hour": str | "unknown", "instances": N, "by_type": {...}, "unknown": {...}}``
    for one running instance per entry of ``instance_types``."""
    counts: dict[str, int] = {}
    for t in instance_types:
        counts[t] = counts.get(t, 0) + 1
    prices = {t: price(target, t, region, cache=cache) for t in sorted(counts)}
    unknown = {t: p.reason for t, p in prices.items() if p.usd_per_hour is None}
    by_type = {t: {"count": n, "usd_per_hour_each": plain(prices[t].usd_per_hour)
                   if prices[t].usd_per_hour is not None else "unknown"}
               for t, n in counts.items()}
    total = (sum((prices[t].usd_per_hour * n for t, n in counts.items()), Decimal(0))
             if not unknown else None)
    return {"usd_per_hour": plain(total) if total is not None else "unknown",
            "instances": len(instance_types), "by_type": by_type, "unknown": unknown}


def tag_line(key: str, status: str | None, error: str = "") -> str:
    """What ``dlc status`` says of the cluster's cost allocation tag: whether Budgets and
    Cost Explorer count the cluster's costs under it, and how to make them. ``status``:
    ``Active``, ``Inactive``, "" (not seen by Billing yet), None (not known: ``error``)."""
    activate = (f"aws ce update-cost-allocation-tags-status --cost-allocation-tags-status "
                f"TagKey={key},Status=Active")
    if status is None:
        return f"cost tag {key}: unknown ({error})"
    if status == "Active":
        return f"cost tag {key}: active (Budgets and Cost Explorer count this cluster's costs)"
    if status == "Inactive":
        return (f"cost tag {key}: NOT active, so Budgets and Cost Explorer do not count this "
                f"cluster's costs under it; activate it (the payer account, takes up to 24 h): "
                f"{activate}")
    return (f"cost tag {key}: not seen by Billing yet (a tag appears up to 24 h after its "
            f"first use); then activate it: {activate}")


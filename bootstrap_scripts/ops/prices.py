"""The prices of a job's nodes, from AWS, cached on EFS: the AWS side of ``ops/cost.py``.

For the nodes of an attempt the job controller asks (on the master, with the master's role):

1. EC2 ``DescribeInstances`` for how each instance was bought (``cost.purchase_of``: Spot,
   a Capacity Block, an On-Demand Capacity Reservation, On-Demand) and its zone;
2. per type and market, the hourly rate: the Price List's ``GetProducts`` (Linux, shared
   tenancy, no pre-installed software, the market option; the Price List API is served from
   us-east-1, https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/using-price-list-query-api.html)
   or, for Spot, ``DescribeSpotPriceHistory`` for the type in the instance's zone
   (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html).

A price is cached on EFS (``cluster/prices/<market>.<place>.<type>.json``, an
:class:`InstancePrice`) so AWS is asked once per price and cluster, not per attempt:
Price List rates for :data:`LIST_PRICE_SECONDS` (they change rarely), a Spot price for
:data:`SPOT_PRICE_SECONDS` (it moves with supply and demand). A price that cannot be had
(no permission, no answer) is remembered in memory only, for :data:`UNKNOWN_SECONDS`, and the
node is recorded with an empty price and why: never guessed.

The master's role needs ``pricing:GetProducts`` and ``ec2:DescribeSpotPriceHistory`` (neither
supports resource-level permissions) besides the ``ec2:DescribeInstances`` every node has.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bootstrap_scripts.ops.cost import (
    Market,
    Purchase,
    hourly_from_price_list,
    plain,
    purchase_of,
    spot_price_at,
)
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.managed_records import NodeUsage
from bootstrap_scripts.protocol.membership import Node
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import InstancePrice

LOG = logging.getLogger("dl-controller")
LIST_PRICE_SECONDS = 7 * 24 * 3600.0
SPOT_PRICE_SECONDS = 3600.0
UNKNOWN_SECONDS = 600.0
#: The Price List Query API's region (it is served from a few regions only).
PRICING_REGION = "us-east-1"
#: Spot prices of Linux instances in a VPC (DescribeSpotPriceHistory's product description).
SPOT_PRODUCT = "Linux/UNIX (Amazon VPC)"
#: How far back DescribeSpotPriceHistory is asked (the price in effect is the newest before).
SPOT_LOOKBACK_SECONDS = 24 * 3600.0

#: ``client(service, region)`` -> a boto3 client (tests pass their own).
ClientFactory = Callable[[str, str], Any]


#: botocore's settings for the price calls: they run in the job controller's loop (its
#: heartbeat), so an AWS that does not answer costs at most about 2 x 5 s per call, not
#: botocore's default 60 s read timeout times its retries (3 minutes seen in an outage).
CLIENT_TIMEOUTS: dict[str, Any] = {"connect_timeout": 5, "read_timeout": 5,
                                   "retries": {"total_max_attempts": 2, "mode": "standard"}}


def boto3_client(service: str, region: str) -> Any:
    import boto3  # only the master's controller prices nodes
    from botocore.config import Config

    return boto3.session.Session(region_name=region or None).client(
        service, config=Config(**CLIENT_TIMEOUTS))


def list_filters(instance_type: str, region: str, market: Market) -> list[dict[str, str]]:
    """GetProducts' TERM_MATCH filters for one type's Linux hourly rate on ``market``."""
    fields = {"instanceType": instance_type, "regionCode": region, "operatingSystem": "Linux",
              "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
              "marketoption": market.price_list_option}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


class PriceBook:
    """The controller's prices: EFS cache, then AWS. ``region`` "" means no AWS to ask
    (every price unknown, said so)."""

    def __init__(self, efs: Path, region: str, *, client: ClientFactory = boto3_client,
                 clock: Callable[[], float] = time.time) -> None:
        self.efs, self.region = efs, region
        self.client_factory, self.clock = client, clock
        self._clients: dict[tuple[str, str], Any] = {}
        #: (market, place, type) -> (when, why) of a price AWS did not give
        self._unknown: dict[tuple[str, str, str], tuple[float, str]] = {}
        #: instance id -> how it was bought (an instance's purchase option never changes)
        self._purchases: dict[str, Purchase] = {}
        #: (when, why) DescribeInstances last failed: not asked again for UNKNOWN_SECONDS
        self._describe_failed: tuple[float, str] | None = None

    def client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            self._clients[key] = self.client_factory(service, region)
        return self._clients[key]

    # -- step 1: how each instance was bought --------------------------------------------
    def purchases(self, instance_ids: Iterable[str]) -> tuple[dict[str, Purchase], str]:
        """Purchase per instance id (DescribeInstances, remembered), and why some are
        missing ("" when none is)."""
        instance_ids = list(instance_ids)
        wanted = sorted({i for i in instance_ids if i and i not in self._purchases})
        why = ""
        failed = self._describe_failed
        if wanted and not self.region:
            why = "no AWS region configured for the job controller"
        elif wanted and failed is not None and self.clock() - failed[0] < UNKNOWN_SECONDS:
            why = failed[1]
        elif wanted:
            try:
                ec2 = self.client("ec2", self.region)
                kwargs: dict[str, Any] = {"InstanceIds": wanted}
                while True:
                    page = ec2.describe_instances(**kwargs)
                    for reservation in page.get("Reservations", []):
                        for inst in reservation.get("Instances", []):
                            p = purchase_of(inst)
                            self._purchases[p.instance_id] = p
                    if not page.get("NextToken"):
                        break
                    kwargs["NextToken"] = page["NextToken"]
            except Exception as exc:  # botocore's errors, no credentials: said, not raised
                why = f"DescribeInstances failed: {exc}"
                self._describe_failed = (self.clock(), why)
                LOG.warning("cannot price the job's nodes: %s", why)
        return {i: self._purchases[i] for i in instance_ids if i in self._purchases}, why

    # -- step 2: the hourly rate ----------------------------------------------------------
    def hourly(self, market: Market, instance_type: str, zone: str, at: float
               ) -> tuple[str, str]:
        """(usd_per_hour, "") or ("", why) for ``instance_type`` bought on ``market``."""
        place = zone if market is Market.SPOT else self.region
        if not place:
            return "", ("the instance's Availability Zone is unknown" if market is Market.SPOT
                        else "no AWS region configured for the job controller")
        key = (market.value, place, instance_type)
        try:
            path = ClusterPaths(self.efs).price(*key)
        except ProtocolError as exc:
            return "", str(exc)
        now = self.clock()
        ttl = SPOT_PRICE_SECONDS if market is Market.SPOT else LIST_PRICE_SECONDS
        with contextlib.suppress(ProtocolError, OSError):
            cached = store.read_record_or_none(path, InstancePrice)
            if cached is not None and now - cached.fetched_at < ttl and cached.usd_per_hour:
                return cached.usd_per_hour, ""
        seen = self._unknown.get(key)
        if seen is not None and now - seen[0] < UNKNOWN_SECONDS:
            return "", seen[1]
        try:
            value, source = self.fetch(market, instance_type, place, at)
        except Exception as exc:  # botocore's errors, no credentials: said, not raised
            value, source = None, f"{exc}"
        if value is None:
            self._unknown[key] = (now, source)
            LOG.warning("no %s price for %s in %s: %s", market.value, instance_type, place,
                        source)
            return "", source
        rec = InstancePrice(market=market.value, place=place, instance_type=instance_type,
                            usd_per_hour=value, fetched_at=now, source=source)
        with contextlib.suppress(OSError):  # no cache: the same answer, asked again later
            path.parent.mkdir(parents=True, exist_ok=True)
            store.write_record(path, rec)
        return value, ""

    def fetch(self, market: Market, instance_type: str, place: str, at: float
              ) -> tuple[str | None, str]:
        """Ask AWS: (the rate, where it came from) or (None, why not)."""
        if market is Market.SPOT:
            ec2 = self.client("ec2", self.region)
            page = ec2.describe_spot_price_history(
                InstanceTypes=[instance_type], ProductDescriptions=[SPOT_PRODUCT],
                AvailabilityZone=place, StartTime=at - SPOT_LOOKBACK_SECONDS, EndTime=at)
            history = [{"Timestamp": h["Timestamp"].timestamp()
                        if hasattr(h.get("Timestamp"), "timestamp") else h.get("Timestamp"),
                        "SpotPrice": h.get("SpotPrice")}
                       for h in page.get("SpotPriceHistory", [])
                       if h.get("AvailabilityZone", place) == place]
            value = spot_price_at(history, at)
            source = f"DescribeSpotPriceHistory {instance_type} {place} {SPOT_PRODUCT}"
            if value is None:
                return None, f"{source}: no Spot price"
            return plain(value), source
        pricing = self.client("pricing", PRICING_REGION)
        page = pricing.get_products(ServiceCode="AmazonEC2", MaxResults=10,
                                    Filters=list_filters(instance_type, place, market))
        value = hourly_from_price_list(page.get("PriceList", []))
        source = (f"Price List GetProducts AmazonEC2 {instance_type} {place} Linux "
                  f"{market.price_list_option}")
        if value is None:
            return None, f"{source}: no hourly price"
        return plain(value), source

    # -- both: an attempt's nodes --------------------------------------------------------
    def node_usage(self, nodes: Iterable[Node], at: float) -> tuple[NodeUsage, ...]:
        """Each node with its market and hourly price (empty price and why when unknown)."""
        nodes = list(nodes)
        bought, why = self.purchases(n.instance_id for n in nodes)
        out = []
        for node in nodes:
            p = bought.get(node.instance_id)
            if p is None:
                out.append(NodeUsage(instance_id=node.instance_id,
                                     instance_type=node.instance_type,
                                     price_note=why or "DescribeInstances did not return it"))
                continue
            if not node.instance_type:
                out.append(NodeUsage(instance_id=node.instance_id, market=p.market.value,
                                     zone=p.zone, price_note="the node's instance type is "
                                     "not in the membership"))
                continue
            value, note = self.hourly(p.market, node.instance_type, p.zone, at)
            out.append(NodeUsage(instance_id=node.instance_id, instance_type=node.instance_type,
                                 market=p.market.value, zone=p.zone, usd_per_hour=value,
                                 price_note=note))
        return tuple(out)

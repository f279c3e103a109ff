"""EC2's vCPU quota classes, and what to do when a launch is over one (pure, no AWS calls).

EC2 counts the vCPUs of an account's running instances per instance class, one quota per
class and region, On-Demand and Spot apart, and refuses a launch above it with
``VcpuLimitExceeded``
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-on-demand-instances.html#ec2-on-demand-instances-limits).
No retry gets past it: only an increase does, which Service Quotas grants on request
(https://docs.aws.amazon.com/servicequotas/latest/userguide/request-quota-increase.html).
One table and one sum serve every side of the product: ``dlc up``'s preflight
(``dlc/preflight.py``) and the stack's own ``Custom::QuotaCheck`` (``lambda_src/quota_check.py``,
before the groups launch) add up the nodes' vCPUs per quota (:func:`vcpu_needs`) and refuse
a need above the quota (:func:`shortfall`), and the capacity adjuster names the quota and
the command that raises it when a launch failed anyway (:func:`increase_step`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class QuotaClass:
    """An EC2 vCPU quota: instances of these families share it (per region)."""

    name: str
    on_demand: str  # quota code of running On-Demand instances
    spot: str | None  # quota code of Spot instance requests


#: Instance families (the letters before the generation digit) -> their vCPU quota
#: (``aws service-quotas list-service-quotas --service-code ec2`` lists them).
_STANDARD = QuotaClass("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
                       "L-1216C47A", "L-34B43A08")
QUOTA_CLASSES: dict[str, QuotaClass] = {
    **{f: _STANDARD for f in ("a", "c", "d", "h", "i", "m", "r", "t", "z")},
    "g": QuotaClass("Running On-Demand G and VT instances", "L-DB2E81BA", "L-3819A6DF"),
    "vt": QuotaClass("Running On-Demand G and VT instances", "L-DB2E81BA", "L-3819A6DF"),
    "p": QuotaClass("Running On-Demand P instances", "L-417A185B", "L-7212CCBC"),
    "inf": QuotaClass("Running On-Demand Inf instances", "L-1945791B", None),
    "trn": QuotaClass("Running On-Demand Trn instances", "L-2C3B7624", None),
    "dl": QuotaClass("Running On-Demand DL instances", "L-6E869C2A", None),
    "f": QuotaClass("Running On-Demand F instances", "L-74FC7D96", None),
    "x": QuotaClass("Running On-Demand X instances", "L-7295265B", None),
}
#: The command that asks Service Quotas for more (the cluster's region is the CLI's).
REQUEST_COMMAND = ("aws service-quotas request-service-quota-increase --service-code ec2 "
                   "--quota-code {code} --desired-value VCPUS")


def quota_class(instance_type: str) -> QuotaClass | None:
    """The vCPU quota an instance type counts against (None: not known here)."""
    match = re.match(r"^([a-z]+)[0-9]", instance_type)
    return QUOTA_CLASSES.get(match.group(1)) if match else None


def increase_step(instance_types: Iterable[str]) -> str:
    """The next step after ``VcpuLimitExceeded`` for a group of ``instance_types``: the
    quota (name and code) and the command that requests more. Without a known type, how to
    find the quota."""
    classes = {c.on_demand: c for c in map(quota_class, instance_types) if c is not None}
    if not classes:
        return ("request an increase of the EC2 vCPU quota of the instances' class in the "
                "cluster's region (`aws service-quotas list-service-quotas --service-code "
                "ec2` lists them; `dlc up` checks them before deploying and names the one "
                "short and the vCPUs needed), then deploy again")
    quotas = " and ".join(f"'{c.name}' ({code})" for code, c in sorted(classes.items()))
    commands = "; ".join(REQUEST_COMMAND.format(code=code) for code in sorted(classes))
    return (f"request an increase of the account's {quotas} vCPU quota in the cluster's "
            f"region to at least the nodes' total vCPUs: `{commands}` (`dlc up` checks the "
            f"quotas before deploying and names the vCPUs needed), then deploy again")


@dataclass(frozen=True)
class Nodes:
    """``count`` nodes of ``instance_type`` (On-Demand, or ``spot``), asked for by ``key``."""

    key: str
    instance_type: str
    count: int
    spot: bool = False


@dataclass(frozen=True)
class Need:
    """vCPUs of one quota the nodes need, and which keys ask for them."""

    code: str
    name: str
    vcpus: int
    keys: tuple[str, ...] = field(default=())


def vcpu_needs(nodes: Iterable[Nodes], vcpus: dict[str, int]) -> tuple[list[Need], list[str]]:
    """The vCPUs per quota of ``nodes`` (``vcpus``: each type's vCPUs; a type without is
    left out), Spot nodes against their class's Spot quota; also the types whose quota is
    not known here."""
    needs: dict[str, Need] = {}
    unknown: list[str] = []
    for n in nodes:
        cls = quota_class(n.instance_type)
        code = cls and (cls.spot if n.spot else cls.on_demand)
        if not n.count or n.instance_type not in vcpus:
            continue
        if cls is None or code is None:
            unknown.append(n.instance_type)
            continue
        name = cls.name.replace("Running On-Demand", "Spot") if n.spot else cls.name
        old = needs.get(code, Need(code, name, 0, ()))
        keys = old.keys if n.key in old.keys else (*old.keys, n.key)
        needs[code] = Need(code, name, old.vcpus + n.count * vcpus[n.instance_type], keys)
    return list(needs.values()), unknown


def shortfall(need: Need, quota: float, region: str) -> str:
    """Why ``need`` cannot launch under ``quota`` (its name, code, value, the need and the
    command that requests more); "" when it fits."""
    if need.vcpus <= quota:
        return ""
    command = REQUEST_COMMAND.format(code=need.code).replace("VCPUS", str(need.vcpus))
    return (f"context keys {', '.join(repr(k) for k in need.keys)}: the nodes need "
            f"{need.vcpus} vCPUs of '{need.name}' ({need.code}), the quota in {region} is "
            f"{quota:g}; request an increase (`{command} --region {region}`) or ask for "
            f"fewer or smaller nodes")

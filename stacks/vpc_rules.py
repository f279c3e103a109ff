"""The rules for an existing VPC, shared by DLClusterStack (``vpcId``…) and DLEmrClusterStack
(``emrVpcId``…), which differ only in their keys' names.

An existing VPC is imported from its ids (``ec2.Vpc.from_vpc_attributes``: no lookup, so synth
needs no AWS access): its private subnets and their zones must be given and agree, one subnet
per zone, in the same order. An existing file system lives in an existing VPC (its mount
targets cannot reach a new one), so it needs one. A new VPC's CIDR does not go with an
imported VPC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from constructs_lib import validation


@dataclass(frozen=True)
class ExistingVpcKeys:
    """The context keys of one stack's existing-VPC settings (for the messages)."""

    vpc_id: str
    vpc_cidr: str
    private_subnets: str
    zones: str
    file_system: str
    public_subnets: str | None = None  # the EMR stack has none


@dataclass(frozen=True)
class ExistingVpc:
    """One stack's values for those keys."""

    vpc_id: str | None
    vpc_cidr: str | None  # None: the default (a new VPC's), left alone
    private_subnets: Sequence[str] | None
    zones: Sequence[str] | None
    file_system: str | None
    public_subnets: Sequence[str] | None = None


def check_existing_vpc(keys: ExistingVpcKeys, v: ExistingVpc, *,
                       zones_need_vpc: bool = False) -> None:
    """Refuse a combination that cannot synthesize or deploy, naming the keys and values.

    ``zones_need_vpc``: the zones key only describes an imported VPC's subnets (EMR); on
    DLClusterStack it also picks a new VPC's zones, so it is allowed alone there."""
    def error(message: str) -> validation.ConfigError:
        return validation.ConfigError(f"context key {message}")

    if v.vpc_id is None:
        if v.file_system:
            raise error(f"'{keys.file_system}' needs '{keys.vpc_id}' (with "
                        f"'{keys.private_subnets}' and '{keys.zones}'): an existing file "
                        f"system is in an existing VPC, and its mount targets cannot reach a "
                        f"new one; got {keys.file_system}={v.file_system!r} without "
                        f"{keys.vpc_id}")
        alone = [(keys.private_subnets, v.private_subnets),
                 (keys.public_subnets, v.public_subnets)]
        if zones_need_vpc:
            alone.append((keys.zones, v.zones))
        for key, value in alone:
            if key and value:
                raise error(f"'{key}' is for an existing VPC and needs '{keys.vpc_id}', got "
                            f"{','.join(value)!r}")
        return
    if v.vpc_cidr is not None:
        raise error(f"'{keys.vpc_cidr}' is the CIDR of a new VPC and does not go with "
                    f"'{keys.vpc_id}', got {keys.vpc_cidr}={v.vpc_cidr!r} with "
                    f"{keys.vpc_id}={v.vpc_id!r}")
    zones = v.zones or ()
    if not v.private_subnets or not zones:
        raise error(f"'{keys.vpc_id}' needs '{keys.private_subnets}' and '{keys.zones}' (the "
                    f"subnets' zones, in the same order), got {keys.vpc_id}={v.vpc_id!r} with "
                    f"{keys.private_subnets}={v.private_subnets!r}, {keys.zones}={v.zones!r}")
    for key, ids in ((keys.private_subnets, v.private_subnets),
                     (keys.public_subnets, v.public_subnets)):
        if key and ids and len(ids) != len(zones):
            raise error(f"'{key}' must list one subnet per zone of '{keys.zones}' "
                        f"({len(zones)}: {','.join(zones)}), got {len(ids)}: {','.join(ids)}")

"""EFA on every network card an instance type has: the launch template's network interfaces.

An accelerated instance type spreads its network bandwidth over several network cards
(p5.48xlarge: 32, p4d.24xlarge: 4), and each card carries its own EFA device; an instance
launched with one EFA interface uses one card, a fraction of what NCCL over EFA could use.
AWS's layout for such types ("Maximize network bandwidth on Amazon EC2 instances with
multiple network cards",
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html):

- the primary interface on network card 0, device index 0, which may not be EFA-only: here
  an ``efa`` interface (EFA with ENA, carries the address, the security groups and a public
  IP) where card 0 supports EFA, else a plain ``interface``;
- one ``efa-only`` interface at device index 0 of every other EFA card.

Which cards support EFA, and how many EFA interfaces the type takes, is what EC2's
DescribeInstanceTypes reports (``NetworkInfo.NetworkCards[].InterfaceTypes``,
``NetworkInfo.EfaInfo.MaximumEfaInterfaces``,
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_NetworkInfo.html). Synth makes no
AWS call, so :data:`EFA_CARDS` holds that answer for the accelerated types with more than one
EFA card (a test compares it with DescribeInstanceTypes' data); any other EFA type gets the
one EFA interface on card 0. ``efa_cards`` on :class:`~constructs_lib.DeepLearningCluster`
overrides the table.
"""

from __future__ import annotations

from collections.abc import Sequence

from constructs_lib import validation

#: Accelerated instance types with more than one EFA network card -> (first EFA card index,
#: number of EFA cards), from DescribeInstanceTypes (the EFA cards are consecutive; p6-b300's
#: card 0 has no EFA).
EFA_CARDS: dict[str, tuple[int, int]] = {
    "g6e.24xlarge": (0, 2), "g6e.48xlarge": (0, 4), "g7.48xlarge": (0, 2),
    "g7e.24xlarge": (0, 2), "g7e.48xlarge": (0, 4),
    "p4d.24xlarge": (0, 4), "p4de.24xlarge": (0, 4),
    "p5.48xlarge": (0, 32), "p5e.48xlarge": (0, 32), "p5en.48xlarge": (0, 16),
    "p6-b200.48xlarge": (0, 8), "p6-b300.48xlarge": (1, 16),
    "trn1.32xlarge": (0, 8), "trn1n.32xlarge": (0, 16),
    "trn2.48xlarge": (0, 16), "trn2u.48xlarge": (0, 16),
}
#: Accelerated instance types with one EFA network card (card 0), from DescribeInstanceTypes.
EFA_SINGLE_CARD: frozenset[str] = frozenset({
    "g4dn.8xlarge", "g4dn.12xlarge", "g4dn.16xlarge", "g4dn.metal",
    "g5.8xlarge", "g5.12xlarge", "g5.16xlarge", "g5.24xlarge", "g5.48xlarge",
    "g6.8xlarge", "g6.12xlarge", "g6.16xlarge", "g6.24xlarge", "g6.48xlarge",
    "g6e.8xlarge", "g6e.12xlarge", "g6e.16xlarge", "g7.8xlarge", "g7.12xlarge",
    "g7.24xlarge", "g7e.8xlarge", "g7e.12xlarge", "p3dn.24xlarge", "p5.4xlarge",
    "trn2.3xlarge",
})
#: Instance families the tables cover (the accelerated ones a training cluster uses): a type
#: of these families in neither table has no EFA, and ``efa=True`` on it is refused at synth
#: (EC2 would refuse every launch of its EFA interface). Other families are left to ``dlc
#: up``'s preflight, which asks DescribeInstanceTypes.
ACCELERATED_FAMILIES = ("g", "p", "trn")


def accelerated(instance_type: str) -> bool:
    """``instance_type`` is of a family the tables cover (``g5.xlarge``, not ``gr6``)."""
    return any(instance_type.startswith(f) and instance_type[len(f):][:1].isdigit()
               for f in ACCELERATED_FAMILIES)


def check_supported(types: Sequence[str]) -> None:
    """ConfigError naming each accelerated type without EFA, and the accelerated types that
    have it with their EFA interface counts (as a warm pool with Spot is refused: at synth,
    not at the launch)."""
    missing = [t for t in types if accelerated(t) and t not in EFA_CARDS
               and t not in EFA_SINGLE_CARD]
    if missing:
        have = sorted([(t, 1) for t in EFA_SINGLE_CARD]
                      + [(t, n) for t, (_first, n) in EFA_CARDS.items()])
        raise validation.ConfigError(
            f"efa=True on {', '.join(missing)}: no EFA on that instance type (EC2 "
            f"DescribeInstanceTypes NetworkInfo.EfaSupported is false, so every launch with "
            f"an EFA interface fails); the accelerated types with EFA, and their EFA "
            f"interfaces: {', '.join(f'{t} ({n})' for t, n in have)}")


def efa_cards(instance_type: str) -> tuple[int, ...]:
    """The network card indexes that get an EFA interface on ``instance_type``."""
    first, count = EFA_CARDS.get(instance_type, (0, 1))
    return tuple(range(first, first + count))


def network_interfaces(cards: Sequence[int], *, groups: list[str],
                       public_ip: bool = False) -> list[dict]:
    """``LaunchTemplateData.NetworkInterfaces``: the primary on card 0 (``efa`` when card 0
    has EFA), then one ``efa-only`` interface per other EFA card (module docstring)."""
    primary: dict = {"NetworkCardIndex": 0, "DeviceIndex": 0, "DeleteOnTermination": True,
                     "Groups": groups, "InterfaceType": "efa" if 0 in cards else "interface"}
    if public_ip:
        primary["AssociatePublicIpAddress"] = True
    others = [{"NetworkCardIndex": card, "DeviceIndex": 0, "DeleteOnTermination": True,
               "Groups": groups, "InterfaceType": "efa-only"} for card in cards if card != 0]
    return [primary, *others]


def group_cards(types: Sequence[str], *, override: Sequence[int] | None = None,
                public_ip: bool = False) -> tuple[int, ...]:
    """The EFA cards of a group whose instances may be any of ``types`` (a fallback list):
    one launch template serves them all, so they must share the layout. ConfigError naming
    the types otherwise, or when a public IP meets several interfaces (EC2 assigns a public
    address only to an instance launched with one network interface)."""
    if override is not None:
        cards = tuple(validation.positive_int("efa_cards", c, minimum=0) for c in override)
        if not cards or len(set(cards)) != len(cards):
            raise validation.ConfigError(
                f"efa_cards must list distinct network card indexes, got {list(override)!r}")
    else:
        check_supported(types)
        layouts = {t: efa_cards(t) for t in types}
        cards = layouts[types[0]]
        differ = [t for t, c in layouts.items() if c != cards]
        if differ:
            raise validation.ConfigError(
                "efa=True gives every EFA network card an interface, and one launch template "
                "serves the group's types, so they must have the same cards; got "
                + ", ".join(f"{t}: {len(c)} (cards {c[0]}-{c[-1]})" for t, c in layouts.items()))
    if public_ip and len(network_interfaces(cards, groups=[])) > 1:
        raise validation.ConfigError(
            f"efa=True on {', '.join(types)} ({len(cards)} EFA network cards) with a public "
            f"master (ssh_cidr): EC2 gives a public address only to an instance launched with "
            f"one network interface; leave ssh_cidr unset (SSM Session Manager)")
    return cards

"""A node's name and features in Slurm.

A node is named after its private address in the form EC2 gives its host name
(``10.0.1.23`` -> ``ip-10-0-1-23``), so the name follows from the signed membership alone:
the master knows every member's Slurm name without asking the node, and a replacement at
another address is another Slurm node. Every daemon is started with this name explicitly
(``slurmd -N``), so nothing depends on the machine's own host name.
"""

from __future__ import annotations

import ipaddress
import re

#: What :func:`node_name` makes, and all :func:`address_of` accepts.
NODE_NAME_RE = re.compile(r"^ip-(\d{1,3})-(\d{1,3})-(\d{1,3})-(\d{1,3})$")
#: Features every node of a role carries; the partitions' node sets select on them.
ROLE_FEATURES = {"master": "master", "worker": "worker"}


class SlurmNameError(ValueError):
    """An address or a Slurm node name of the wrong shape."""


def node_name(address: str) -> str:
    """``ip-a-b-c-d`` for the IPv4 address ``a.b.c.d``; SlurmNameError for anything else."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        raise SlurmNameError(f"not an IPv4 address: {address!r}") from None
    return "ip-" + str(ip).replace(".", "-")


def address_of(name: str) -> str | None:
    """The address a Slurm node name of ours stands for; None for any other name (a node
    someone added by hand is not ours to name)."""
    m = NODE_NAME_RE.match(name)
    if not m:
        return None
    try:
        return str(ipaddress.IPv4Address(".".join(m.groups())))
    except ValueError:
        return None


def instance_type_feature(instance_type: str) -> str:
    """An instance type as a Slurm feature (``p4d.24xlarge`` -> ``p4d_24xlarge``): features
    are words, so the dot becomes an underscore."""
    return re.sub(r"[^A-Za-z0-9_]", "_", instance_type)


def features(role: str, instance_type: str = "") -> tuple[str, ...]:
    """The features of a node: its role, and its instance type when known."""
    if role not in ROLE_FEATURES:
        raise SlurmNameError(f"role must be master or worker, got {role!r}")
    extra = (instance_type_feature(instance_type),) if instance_type else ()
    return (ROLE_FEATURES[role], *extra)

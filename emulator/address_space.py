"""The emulated account's addresses: a /16 of the loopback network for its VPC.

The emulated nodes are processes of one host, each bound to its own loopback address, so
the VPC the stack is deployed with (``-c vpcCidr``) must be a loopback one: moto then hands
the instances addresses of this host. moto hands them out in order from each subnet's
start, as EC2 may, so two emulated accounts on one host with the same VPC give their first
nodes the same addresses, and their servers on fixed ports (the rendezvous, sshd) meet.
That is what two accounts on one host need and AWS never shows: separate networks. So each
emulated account may take its own /16 (``DL_EMULATOR_VPC_CIDR``, read by the emulator only,
never given to a node); the test suite's parallel workers each take one.

The runner's suites place nodes without moto (``resources.loopback_instances``) in the /16
after the VPC's, so those never meet a deployed cluster's either.
"""

from __future__ import annotations

import ipaddress
import os

#: The emulator's setting (the emulator's process only), and its value when unset.
VPC_CIDR_ENV = "DL_EMULATOR_VPC_CIDR"
DEFAULT_VPC_CIDR = "127.20.0.0/16"
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
#: A VPC's second octet stays below this: the runner's /16 after the VPC's is then at most
#: ``127.254``, and ``127.255`` (the loopback network's broadcast) is never one's.
VPC_OCTET_LIMIT = 254


def vpc_cidr() -> str:
    """The emulated VPC's CIDR: ``DL_EMULATOR_VPC_CIDR`` or ``127.20.0.0/16``; a /16 of the
    loopback network below ``127.254.0.0`` (the runner's nodes take the next /16)."""
    raw = os.environ.get(VPC_CIDR_ENV) or DEFAULT_VPC_CIDR
    try:
        net = ipaddress.ip_network(raw)
    except ValueError:
        net = None
    if net is None or net.prefixlen != 16 or not net.subnet_of(LOOPBACK) \
            or net.network_address.packed[1] >= VPC_OCTET_LIMIT:
        raise ValueError(f"{VPC_CIDR_ENV}={raw!r}: the emulated VPC must be a /16 of the "
                         f"loopback network 127.0.0.0/8 below 127.{VPC_OCTET_LIMIT}.0.0, such "
                         f"as {DEFAULT_VPC_CIDR}")
    return str(net)


def subnets() -> tuple[tuple[str, str], tuple[str, str]]:
    """(public, private) subnets of the VPC, two /18 each, as the stack's two zones have."""
    quarters = [str(s) for s in ipaddress.ip_network(vpc_cidr()).subnets(new_prefix=18)]
    return (quarters[0], quarters[1]), (quarters[2], quarters[3])


def loopback_prefix() -> str:
    """``127.N`` of the /16 after the VPC's, where nodes placed without moto live."""
    return f"127.{ipaddress.ip_network(vpc_cidr()).network_address.packed[1] + 1}"


def vpc_for(index: int) -> str:
    """The /16 for the ``index``-th of several emulated accounts on one host (the test
    suite's parallel workers): the default's, then every second /16 after it, so each
    account's VPC and the runner's /16 after it meet no other account's."""
    first = ipaddress.ip_network(DEFAULT_VPC_CIDR).network_address.packed[1]
    last = (VPC_OCTET_LIMIT - 1 - first) // 2  # as vpc_cidr checks it
    if not 0 <= index <= last:
        raise ValueError(f"emulated account {index}: no loopback /16 is left for its VPC "
                         f"(accounts 0 to {last} fit)")
    return f"127.{first + 2 * index}.0.0/16"

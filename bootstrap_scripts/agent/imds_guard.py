"""Only root reaches the instance metadata service: jobs get no instance-role credentials.

Every process on an instance can ask IMDS for the instance role's credentials, and a job's
processes run as the user who submitted it. AWS's answer for shared hosts (ECS, EKS) is a
netfilter rule on the host that rejects the metadata address for everyone but the node's own
agents: here an ``iptables`` owner match, ``-d <IMDS> -p tcp --dport <port> -m owner !
--uid-owner 0 -j REJECT`` in the OUTPUT chain (or the same in an ``nft`` table of its own
where ``iptables`` is not installed). Root's processes (the node agent, the executor, the
job controller, the SSM Agent) keep the role; a user's job gets "connection refused".

The address is the one botocore reads (``AWS_EC2_METADATA_SERVICE_ENDPOINT`` or its config
file, else ``http://169.254.169.254/``): the endpoint the node's own code uses, so the guard
and the agents cannot disagree about which service to guard. Rules live in the kernel, not on
disk: they are installed at boot by the installer and again by every executor start (before
it runs any job), both idempotent (``iptables -C`` first; the nft table is replaced whole).
Forwarded traffic is the other way in: a container on a bridge network (Docker's bridge
exists on the DLAMI) sends its packets through the host's FORWARD chain, not OUTPUT, and
IMDS's hop limit of 2 lets them reach it as if they were the node's own; the owner match
cannot see them. A second rule, ``-d <IMDS> -j DROP`` in FORWARD (the ``forward`` chain of
the same nft table), drops every forwarded packet to the metadata address, whoever sent it:
nothing that is routed through a node ever needs the node's metadata. Jobs' containers use
the host's network (``bootstrap_scripts/containers``) and stay under the owner match.
When metadata is switched off (``AWS_EC2_METADATA_DISABLED=true``, botocore's own switch)
there is no service to guard and nothing is installed.

:func:`rule` and :func:`nft_script` build the exact commands (pure, unit-tested);
:func:`ensure` runs them.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import subprocess
import sys
from urllib.parse import urlsplit

#: The comment (iptables) / table name (nft) that marks the product's rule.
COMMENT = "dl-imds-root-only"
#: The comment of the FORWARD rule (bridged containers' traffic to IMDS dropped).
FORWARD_COMMENT = "dl-imds-no-forward"
NFT_TABLE = "dl_imds_guard"
#: The uid allowed through: root, which runs the node's agents.
ROOT_UID = 0


class GuardError(RuntimeError):
    """The rule could not be installed; the message says which command failed and why."""


def metadata_disabled() -> bool:
    return os.environ.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true"


def target(endpoint: str) -> tuple[str, int]:
    """The (IPv4 address, TCP port) of an IMDS endpoint URL; GuardError for anything a
    netfilter rule could not name exactly (a host name, IPv6)."""
    parts = urlsplit(endpoint)
    try:
        address = ipaddress.ip_address(parts.hostname or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise GuardError(f"cannot guard the metadata endpoint {endpoint!r}: {exc}") from None
    if address.version != 4:
        raise GuardError(f"cannot guard the metadata endpoint {endpoint!r}: only IPv4 (the "
                         f"launch templates leave IMDS's IPv6 endpoint off)")
    return str(address), port


def rule(address: str, port: int) -> list[str]:
    """The OUTPUT chain rule (after ``-C``/``-I``/``-D OUTPUT``): non-root to IMDS rejected."""
    return ["-d", f"{address}/32", "-p", "tcp", "--dport", str(port),
            "-m", "owner", "!", "--uid-owner", str(ROOT_UID),
            "-m", "comment", "--comment", COMMENT, "-j", "REJECT",
            "--reject-with", "tcp-reset"]


def forward_rule(address: str) -> list[str]:
    """The FORWARD chain rule: every forwarded packet to IMDS dropped (any port, any owner)."""
    return ["-d", f"{address}/32", "-m", "comment", "--comment", FORWARD_COMMENT, "-j", "DROP"]


def nft_script(address: str, port: int) -> str:
    """The same in nftables: a table of its own, replaced whole (``nft -f -``)."""
    return (f"table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n"
            f"table inet {NFT_TABLE} {{\n"
            f"  chain output {{\n"
            f"    type filter hook output priority 0; policy accept;\n"
            f"    ip daddr {address} tcp dport {port} meta skuid != {ROOT_UID} "
            f"reject with tcp reset\n"
            f"  }}\n"
            f"  chain forward {{\n"
            f"    type filter hook forward priority 0; policy accept;\n"
            f"    ip daddr {address} drop\n"
            f"  }}\n"
            f"}}\n")


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30,
                              check=False)
    except OSError as exc:
        raise GuardError(f"{argv[0]}: {exc}") from None


def _insert(iptables: str, chain: str, spec: list[str], what: str) -> bool:
    """Insert ``spec`` first in ``chain`` unless it is there; True when it was added."""
    if _run([iptables, "-w", "-C", chain, *spec]).returncode == 0:
        return False
    res = _run([iptables, "-w", "-I", chain, "1", *spec])
    if res.returncode != 0:
        raise GuardError(f"iptables -I {chain} for {what} failed: "
                         f"{(res.stderr or res.stdout).strip()}")
    return True


def ensure(endpoint: str | None = None) -> str:
    """Install the rule for ``endpoint`` (default: botocore's) unless it is there; returns
    what guards it ("" when metadata is switched off). GuardError when it cannot."""
    if metadata_disabled() and endpoint is None:
        return ""
    if endpoint is None:
        from bootstrap_scripts.agent.identity import metadata_endpoint

        endpoint = metadata_endpoint()
    address, port = target(endpoint)
    iptables = shutil.which("iptables")
    if iptables:
        added = [chain for chain, spec in (("OUTPUT", rule(address, port)),
                                           ("FORWARD", forward_rule(address)))
                 if _insert(iptables, chain, spec, f"{address}:{port}")]
        return f"iptables rule for {address}:{port}" + ("" if added else " (already there)")
    nft = shutil.which("nft")
    if nft:
        res = _run([nft, "-f", "-"], nft_script(address, port))
        if res.returncode != 0:
            raise GuardError(f"nft table {NFT_TABLE} for {address}:{port} failed: "
                             f"{(res.stderr or res.stdout).strip()}")
        return f"nft table {NFT_TABLE} for {address}:{port}"
    raise GuardError("neither iptables nor nft is installed: cannot keep jobs away from the "
                     "instance metadata service (install iptables)")


def remove(endpoint: str) -> None:
    """Take the rule for ``endpoint`` away (a machine that goes away takes its kernel's rules
    along; the emulator, whose nodes share one kernel, calls this)."""
    address, port = target(endpoint)
    iptables = shutil.which("iptables")
    if iptables:
        for chain, spec in (("OUTPUT", rule(address, port)), ("FORWARD", forward_rule(address))):
            while _run([iptables, "-w", "-C", chain, *spec]).returncode == 0:
                if _run([iptables, "-w", "-D", chain, *spec]).returncode != 0:
                    break


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dl-imds-guard", description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", default=None, help="IMDS URL (default: botocore's)")
    args = p.parse_args(argv)
    try:
        what = ensure(args.endpoint)
    except GuardError as exc:
        print(f"dl-imds-guard: {exc}", file=sys.stderr)
        return 1
    print(f"dl-imds-guard: {what or 'instance metadata is switched off: nothing to guard'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

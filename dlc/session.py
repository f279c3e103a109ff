"""``dlc connect`` and ``dlc tunnel``: SSM Session Manager, through AWS's own CLI.

A shell is ``aws ssm start-session --target i-…`` (the default session document,
SSM-SessionManagerRunShell); a tunnel adds ``--document-name AWS-StartPortForwardingSession``
with the remote and local ports
(https://docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-sessions-start.html).
Both need the Session Manager plugin next to the AWS CLI; without it ``dlc`` says how to
install it instead of failing inside ``aws``. No port is opened on the nodes: the SSM Agent
connects out.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil

from dlc import aws
from dlc.errors import DlcError, NotFound, UsageError, listing
from dlc.remote import Remote
from dlc.target import Target

PLUGIN = "session-manager-plugin"
PLUGIN_INSTALL_URL = ("https://docs.aws.amazon.com/systems-manager/latest/userguide/"
                      "session-manager-working-with-install-plugin.html")
PORT_FORWARDING = "AWS-StartPortForwardingSession"


def resolve_node(target: Target, spec: str) -> aws.Instance:
    """NODE: ``master``, a rank (from the master's membership), a private address, or an
    instance id of the cluster; NotFound lists what exists."""
    stack = aws.describe_stack(target)
    nodes = aws.instances(target, stack)
    spec = spec.strip()
    if spec == "master":
        return aws.master_instance(target, stack, nodes)
    if spec.startswith("i-"):
        match = [n for n in nodes if n.instance_id == spec]
        what = f"instance {spec}"
    elif spec.isdigit():
        address = _rank_address(target, stack, nodes, int(spec))
        match = [n for n in nodes if n.address == address]
        what = f"rank {spec} ({address})"
    else:
        try:
            address = str(ipaddress.ip_address(spec))
        except ValueError:
            raise UsageError(f"NODE must be 'master', a rank, a private address or an "
                             f"instance id (i-…), got {spec!r}") from None
        match = [n for n in nodes if n.address == address]
        what = f"address {address}"
    if not match:
        raise NotFound(f"no node of stack {stack.name} has {what}; nodes: "
                       + listing([f"{n.instance_id} {n.role} {n.address or '-'}"
                                  for n in nodes]))
    return match[0]


def _rank_address(target: Target, stack: aws.Stack, nodes: list[aws.Instance],
                  rank: int) -> str:
    master = aws.master_instance(target, stack, nodes)
    health = Remote(target, master.instance_id).json(["dl-health", "--json"],
                                                     allow_codes=(0, 1))
    members = health.get("nodes", []) if isinstance(health, dict) else []
    for m in members:
        if m.get("rank") == rank:
            return str(m.get("address"))
    raise NotFound(f"no member of the cluster has rank {rank}; ranks: "
                   + listing([f"{m.get('rank')} {m.get('address')}" for m in members]))


def base_argv(target: Target, instance_id: str) -> list[str]:
    argv = ["aws", "ssm", "start-session", "--target", instance_id, "--region", target.region]
    if target.profile:
        argv += ["--profile", target.profile]
    if target.endpoint:
        argv += ["--endpoint-url", target.endpoint]
    return argv


def connect_argv(target: Target, instance_id: str) -> list[str]:
    return base_argv(target, instance_id)


def check_ports(port: int, local_port: int) -> None:
    for name, value in (("PORT", port), ("--local-port", local_port)):
        if not 1 <= value <= 65535:
            raise UsageError(f"{name} must be a TCP port 1..65535, got {value}")


def tunnel_argv(target: Target, instance_id: str, port: int, local_port: int) -> list[str]:
    check_ports(port, local_port)
    params = {"portNumber": [str(port)], "localPortNumber": [str(local_port)]}
    return [*base_argv(target, instance_id), "--document-name", PORT_FORWARDING,
            "--parameters", json.dumps(params, separators=(",", ":"))]


def check_tools() -> None:
    """The AWS CLI and the Session Manager plugin must both be on PATH."""
    if shutil.which("aws") is None:
        raise DlcError("the AWS CLI (aws) is not on PATH: install it "
                       "(https://docs.aws.amazon.com/cli/latest/userguide/"
                       "getting-started-install.html), then the Session Manager plugin")
    if shutil.which(PLUGIN) is None:
        raise DlcError(f"the Session Manager plugin ({PLUGIN}) is not on PATH; aws ssm "
                       f"start-session needs it. Install it: {PLUGIN_INSTALL_URL} "
                       "(or use --dry-run to print the command)")


def start(target: Target, argv: list[str], *, dry_run: bool, echo) -> None:
    """Print the command (``--dry-run``) or replace this process with it."""
    if dry_run:
        echo(shlex.join(argv))
        return
    check_tools()
    os.execvpe(argv[0], argv, target.cli_env())

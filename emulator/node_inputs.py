"""What an emulated node's processes are given: their environment, and the user data's
arguments as the emulator passes them to the real installer.

An EC2 instance's processes get no region from their machine (it is in instance metadata),
and a node with an instance profile gets no static credentials (the metadata endpoint serves
its role's). :func:`base_env` builds every node process's environment (the units, the
installer, SSM Run Command, the demo's and the tests' commands "on a node"): of AWS only
what the caller gives, minus the region; :mod:`emulator.nodes` also drops
:data:`STATIC_CREDENTIALS` on a node with a role. The user data's arguments are checked
against the installer's own parser before any node boots (:func:`check_agent_args`: a drift
between the stack and the node code fails there, not on AWS), then given the emulator's
substitutions (:func:`emulator_args`: the node's root, its EFS directory, the emulated wait
handle; docs/protocol.md §4).

:mod:`emulator.nodes` boots nodes with these; ``PYTHON`` and :func:`base_env` are also what
the demo and the tests use for a command run as on a node. Nothing here starts a process.
"""

from __future__ import annotations

import io
import os
import shlex
import sys
from contextlib import redirect_stderr
from pathlib import Path

from emulator.address_space import VPC_CIDR_ENV
from emulator.deploy import REPO_ROOT, DeployError

#: The Python every node process runs (the emulator's own: the nodes share its packages).
PYTHON = sys.executable


#: What an EC2 instance's processes are never given: the AWS SDKs do not take the region
#: from instance metadata, so a node that relied on these would fail on AWS. Nodes find the
#: region where a real node does: the file the installer writes from the (emulated) IMDS.
NOT_ON_A_NODE = ("AWS_REGION", "AWS_DEFAULT_REGION")
#: Static credentials: a node with an instance profile gets its role's from the metadata
#: endpoint instead, as an EC2 instance does (the endpoint's own process keeps them: it is
#: EC2's side, which assumes the role).
STATIC_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def base_env(aws: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process on an emulated node: this repo on PYTHONPATH, this
    Python first on PATH, and of AWS only what ``aws`` says (nothing: no AWS at all) minus
    the region (:data:`NOT_ON_A_NODE`). The endpoint URL of moto's server stays: a node
    could not reach the emulated AWS without it (docs/emulator.md). The emulator's own
    address-space setting stays with the emulator."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and k != VPC_CIDR_ENV}
    env.update({k: v for k, v in (aws or {}).items() if k not in NOT_ON_A_NODE})
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PATH"] = os.path.dirname(PYTHON) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def check_agent_args(args: list[str], group: str) -> None:
    """The user data's arguments must parse with the installer's parser, the agent's own
    for the agent's arguments (drift check)."""
    from bootstrap_scripts.agent.install import parse_args

    err = io.StringIO()
    try:
        with redirect_stderr(err):
            parse_args(args)
    except SystemExit:
        raise DeployError(f"the user data of group {group} passes arguments the node "
                          f"installer or agent rejects: {shlex.join(args)}\n"
                          f"{err.getvalue().strip()}") from None
    for required in ("--mount-point", "--wait-handle", "--role", "--cluster-id"):
        if required not in args:
            raise DeployError(f"the user data of group {group} does not pass {required} "
                              f"(args: {shlex.join(args)}); see docs/protocol.md §4")


def emulator_args(args: list[str], *, root: Path, efs: Path, wait_handle: str) -> list[str]:
    """The user data's args with the emulator's substitutions (protocol §4)."""
    out = list(args)
    for flag, value in (("--mount-point", str(efs)), ("--wait-handle", wait_handle)):
        i = out.index(flag)
        out[i + 1] = value
    return [*out, "--root", str(root), "--no-mount"]

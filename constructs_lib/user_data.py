"""The node bootstrap script (user data): short, readable, and calling tested code.

Everything interesting happens in ``bootstrap_scripts`` (installed from an S3 asset); this
script only fetches it and runs ``bootstrap_scripts.install`` with the node's settings. The
local emulator reads the arguments back from the launch template, so what is rendered here
is exactly what the emulated nodes run.
"""

from __future__ import annotations

from collections.abc import Mapping

INSTALL_MODULE = "bootstrap_scripts.install"
NODE_LIB_DIR = "/opt/deeplearning/lib"
BOOTSTRAP_LOG = "/var/log/dl-bootstrap.log"


def _quote(value: str) -> str:
    """Single-quote for bash. Deploy-time tokens are quoted the same way: they resolve to
    URLs, ids and names, none of which contains a single quote."""
    return "'" + str(value).replace("'", "'\"'\"'") + "'"


def render_bootstrap_commands(
    *, asset_s3_url: str, agent_settings: Mapping[str, str], python: str = "python3"
) -> list[str]:
    """Shell lines of the user data (after the shebang that CDK adds)."""
    args = " ".join(f"--{key} {_quote(value)}" for key, value in agent_settings.items())
    return [
        "# Deep-learning cluster node bootstrap (rendered by constructs_lib.NodeGroup).",
        "set -euo pipefail",
        f"exec > >(tee -a {BOOTSTRAP_LOG}) 2>&1",
        f'PY={python}; [ -x "$PY" ] || PY=python3',
        f"mkdir -p {NODE_LIB_DIR}",
        f"aws s3 cp --only-show-errors {_quote(asset_s3_url)} /opt/deeplearning/node-scripts.zip",
        "rm -rf /opt/deeplearning/lib/bootstrap_scripts",
        f'"$PY" -m zipfile -e /opt/deeplearning/node-scripts.zip {NODE_LIB_DIR}/bootstrap_scripts',
        "# EFS in-transit encryption needs efs-utils (mount -t efs -o tls) where the OS has it.",
        "if command -v dnf >/dev/null; then dnf install -y -q amazon-efs-utils || true; fi",
        '"$PY" -c \'import boto3\' 2>/dev/null || "$PY" -m pip install -q boto3',
        f"cd {NODE_LIB_DIR}",
        f'PYTHONPATH={NODE_LIB_DIR} exec "$PY" -m {INSTALL_MODULE} {args}',
    ]

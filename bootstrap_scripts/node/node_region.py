"""The node's AWS region: learned once from instance metadata, kept in one root-owned file.

WHY: the AWS SDKs (boto3, the AWS CLI) take the region from ``AWS_REGION`` /
``AWS_DEFAULT_REGION`` or from a shared config file, never from the instance metadata
service, so a client created on an EC2 instance without either fails with "You must specify
a region" (https://docs.aws.amazon.com/sdkref/latest/guide/feature-region.html). Nothing on a
fresh instance sets them: not systemd, not SSM Run Command, not cloud-init.

So the installer reads the region from IMDSv2 (``placement/region``) and writes
``/etc/dl-cluster/aws-region.env`` (``AWS_REGION=…`` and ``AWS_DEFAULT_REGION=…``). Readers:
- every systemd unit (``EnvironmentFile=``),
- the ``dl-*`` command wrappers (they source it when the caller set no region: an SSM Run
  Command or a Session Manager shell, whoever runs them, whatever ``HOME`` is),
- ``/etc/profile.d/dl-aws-region.sh`` for login shells (the ``aws`` CLI by hand),
- the node tools themselves (:func:`client_region`) when started as ``python -m``.
The same file sets how patiently the SDK asks instance metadata for the instance role's
credentials (``AWS_METADATA_SERVICE_TIMEOUT``, ``AWS_METADATA_SERVICE_NUM_ATTEMPTS``): the
SDKs' defaults are one attempt with a one-second timeout
(https://docs.aws.amazon.com/sdkref/latest/guide/feature-imds-credentials.html), and a
client created while IMDS is slow to answer (a busy instance, IMDS throttling) has no
credentials for its whole life: every call then fails with "Unable to locate credentials".
A per-user ``~/.aws/config`` was not chosen: it depends on which user runs the command and
on ``HOME`` being set, and the file here serves every user and every entry point.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

#: Under the node root (``/`` on a real node).
ENV_FILE = "etc/dl-cluster/aws-region.env"
PROFILE_FILE = "etc/profile.d/dl-aws-region.sh"
VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
#: How patiently the SDK fetches the instance role's credentials (the defaults: 1 s, 1 try).
METADATA_SETTINGS = {"AWS_METADATA_SERVICE_TIMEOUT": "5",
                     "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "3"}
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_MAX_BYTES = 4096


class RegionError(RuntimeError):
    """No region could be found, or a file holds something that is not one."""


def valid_region(region: str) -> bool:
    return bool(_REGION.match(region or ""))


def env_file(root: str | Path = "/") -> Path:
    return Path(root) / ENV_FILE


def render_env_file(region: str) -> str:
    """The ``EnvironmentFile`` text (also valid ``sh`` to source)."""
    if not valid_region(region):
        raise RegionError(f"{region!r} is not an AWS region (e.g. us-east-1)")
    return ("# Written by bootstrap_scripts.agent.install from instance metadata "
            "(placement/region).\n" + "".join(f"{v}={region}\n" for v in VARIABLES)
            + "".join(f"{k}={v}\n" for k, v in METADATA_SETTINGS.items()))


def render_profile(root: str | Path = "/") -> str:
    """``/etc/profile.d`` snippet: login shells get the region unless they already have one."""
    path = env_file(root)
    return ("# Written by bootstrap_scripts.agent.install: the AWS region of this instance.\n"
            f'if [ -z "${{AWS_REGION:-}}${{AWS_DEFAULT_REGION:-}}" ] && [ -r \'{path}\' ]; then\n'
            f"    set -a; . '{path}'; set +a\n"
            "fi\n")


def read_installed(root: str | Path = "/") -> str:
    """The region the installer wrote under ``root``, or "" when there is none.

    Opened with ``O_NOFOLLOW`` and accepted only from a regular file owned by root or by us
    (tools may run as root: a file planted by another user must not steer them)."""
    for line in read_installed_file(env_file(root)).splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == "AWS_REGION" and valid_region(value.strip()):
            return value.strip()
    return ""


def read_installed_file(path: str | Path) -> str:
    """The text of a file the installer wrote (under ``etc/dl-cluster/``), or "" when there
    is none. Opened with ``O_NOFOLLOW`` and taken only from a regular file owned by root or
    by us: tools may run as root, and a file another user planted must not steer them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()):
            return ""
        return os.read(fd, _MAX_BYTES).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def configured_region() -> str:
    """What boto3 would use on its own (environment or shared config), or ""."""
    try:
        import botocore.session
    except ImportError:
        return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""
    try:
        return botocore.session.Session().get_config_variable("region") or ""
    except Exception:  # e.g. AWS_PROFILE names a profile the config lacks: boto3 will say so
        return ""


def client_region(root: str | Path | None = None) -> str | None:
    """The region for a node tool's boto3 client: the caller's configuration first, else the
    installed file under ``root`` (default ``$DL_ROOT`` or ``/``); None lets boto3 decide
    (and name the problem) when neither has one."""
    if root is None:
        root = os.environ.get("DL_ROOT") or "/"
    return configured_region() or read_installed(root) or None


def adopt(root: str | Path = "/") -> str:
    """For a tool's whole process (and what it starts): when the caller configured no
    region, take the installed one into ``AWS_REGION`` / ``AWS_DEFAULT_REGION``. Returns the
    region now in effect ("" if none anywhere: boto3 will then name the problem)."""
    configured = configured_region()
    if configured:
        return configured
    region = read_installed(root)
    if region:
        for variable in VARIABLES:
            os.environ[variable] = region
        for variable, value in METADATA_SETTINGS.items():
            os.environ.setdefault(variable, value)
    return region

"""Prop and context validation with messages that name the bad value.

Raised at synth time, so a typo fails `cdk synth` with the key and the value instead of a
CloudFormation rollback twenty minutes later. Tokens (unresolved deploy-time values) are let
through: they cannot be checked before deployment.
"""

from __future__ import annotations

import ipaddress
import re

from aws_cdk import Token

MIN_ROOT_VOLUME_GIB = 50
_FS_ID = re.compile(r"^fs-[0-9a-f]{8,40}$")
_AMI_ID = re.compile(r"^ami-[0-9a-f]{8,40}$")
_MOUNT_POINT = re.compile(r"^/[A-Za-z0-9._/-]*$")


class ConfigError(ValueError):
    """A setting is invalid; the message names the setting and the value."""


def _label(name: str) -> str:
    return f"'{name}'"


def positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    """Accept an int, or a string of digits (context values arrive as strings from -c)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        number = int(value)
    else:
        raise ConfigError(f"{_label(name)} must be an integer >= {minimum}, got {value!r}")
    if number < minimum:
        raise ConfigError(f"{_label(name)} must be an integer >= {minimum}, got {value!r}")
    return number


def root_volume(name: str, value: object) -> int:
    size = positive_int(name, value, minimum=1)
    if size < MIN_ROOT_VOLUME_GIB:
        raise ConfigError(
            f"{_label(name)} must be at least {MIN_ROOT_VOLUME_GIB} GiB (the Deep Learning AMI's "
            f"root file system does not fit in less), got {value!r}"
        )
    return size


def cidr(name: str, value: str) -> str:
    if Token.is_unresolved(value):
        return value
    try:
        net = ipaddress.ip_network(str(value), strict=True)
    except ValueError as exc:
        raise ConfigError(
            f"{_label(name)} must be a CIDR block like 10.0.0.0/16, got {value!r} ({exc})"
        ) from None
    if net.version != 4:
        raise ConfigError(f"{_label(name)} must be an IPv4 CIDR block, got {value!r}")
    return str(net)


def ssh_cidr(name: str, value: str) -> str:
    block = cidr(name, value)
    if not Token.is_unresolved(block) and ipaddress.ip_network(block).prefixlen == 0:
        raise ConfigError(
            f"{_label(name)} must not open SSH to the whole internet, got {value!r}; "
            "give your own address range (e.g. 203.0.113.7/32) or leave it unset "
            "and connect with SSM Session Manager"
        )
    return block


def vpc_cidr(name: str, value: str) -> str:
    block = cidr(name, value)
    if not Token.is_unresolved(block) and not 16 <= ipaddress.ip_network(block).prefixlen <= 24:
        raise ConfigError(f"{_label(name)} must have a prefix between /16 and /24, got {value!r}")
    return block


def file_system_id(name: str, value: str) -> str:
    if Token.is_unresolved(value):
        return value
    if not _FS_ID.match(str(value)):
        raise ConfigError(f"{_label(name)} must look like fs-0123456789abcdef0, got {value!r}")
    return str(value)


def ami_id(name: str, value: str) -> str:
    if Token.is_unresolved(value):
        return value
    if not _AMI_ID.match(str(value)):
        raise ConfigError(f"{_label(name)} must look like ami-0123456789abcdef0, got {value!r}")
    return str(value)


def mount_point(name: str, value: str) -> str:
    if not _MOUNT_POINT.match(str(value)) or str(value) == "/" or ".." in str(value).split("/"):
        raise ConfigError(
            f"{_label(name)} must be an absolute directory path such as /efs, got {value!r}"
        )
    return str(value).rstrip("/")


def one_of(name: str, value: str, choices: list[str] | tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{_label(name)} must be one of {', '.join(choices)}, got {value!r}")
    return value

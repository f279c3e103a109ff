"""Prop and context validation with messages that name the setting and the bad value.

Raised at synth time, so a typo fails `cdk synth` with the key and the value instead of a
CloudFormation rollback twenty minutes later. Tokens (unresolved deploy-time values) are let
through: they cannot be checked before deployment.

Every check takes the ``name`` to print as given: constructs pass the prop name
(``worker_count``) and raise through :func:`reports_path`, which puts the construct's path
in front (``DLClusterStack/Cluster: worker_count must be an integer >= 1, got 0``); the
stacks pass the quoted context key (``context key 'workerCount' must be ...``).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable
from typing import Any, TypeVar

from aws_cdk import Token
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from bootstrap_scripts.data import checksums

MIN_ROOT_VOLUME_GIB = 50
#: gp3's largest volume (16 TiB).
MAX_ROOT_VOLUME_GIB = 16384
_FS_ID = re.compile(r"^fs-[0-9a-f]{8,40}$")
_AMI_ID = re.compile(r"^ami-[0-9a-f]{8,40}$")
_MOUNT_POINT = re.compile(r"^/[A-Za-z0-9._/-]*$")
#: An EC2 instance type name, ``family.size``: the family is letters, a generation digit and
#: attribute letters/digits, optionally ``-suffix`` (g5, p4d, trn1n, m7i-flex, p6-b200,
#: u-6tb1); the size is one of EC2's size names (nano ... xlarge, Nxlarge, metal, metal-Nxl).
_INSTANCE_TYPE = re.compile(
    r"^(u-[0-9]+tb[0-9]+|[a-z]+[0-9]+[a-z0-9]*(-[a-z0-9]+)*)"
    r"\.(nano|micro|small|medium|large|xlarge|[1-9][0-9]*xlarge|metal(-[1-9][0-9]*xl)?)$")
#: Directories of the operating system and of the node software: a file system mounted on,
#: under or above one of them hides or shadows what the node needs to boot and run.
SYSTEM_DIRECTORIES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc",
                      "/root", "/run", "/sbin", "/snap", "/sys", "/tmp", "/usr", "/var/lib",
                      "/var/log", "/var/run", "/var/cache", "/var/spool", "/opt/deeplearning",
                      "/opt/pytorch", "/opt/aws")
#: The widest SSH source range accepted without an explicit opt-in: a /16 (65,536 addresses).
MAX_SSH_PREFIX_WIDTH = 16

_Init = TypeVar("_Init", bound=Callable[..., None])


class ConfigError(ValueError):
    """A setting is invalid; the message names the setting and the value, and ``path`` the
    construct whose prop it is (None for a stack's context keys)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def reports_path(init: _Init) -> _Init:
    """Decorate a construct's ``__init__(self, scope, construct_id, ...)`` so that a
    :class:`ConfigError` raised while it runs names the construct's path (an error from a
    nested construct keeps the nested path)."""

    @functools.wraps(init)
    def wrapper(self: Any, scope: Construct, construct_id: str, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, scope, construct_id, *args, **kwargs)
        except ConfigError as exc:
            if exc.path is None:
                parent = scope.node.path
                exc.path = f"{parent}/{construct_id}" if parent else construct_id
            raise

    return wrapper  # type: ignore[return-value]


def positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    """Accept an int, or a string of digits (context values arrive as strings from -c)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        number = int(value)
    else:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if number < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return number


def count(name: str, value: object, *, minimum: int, maximum: int) -> int:
    """An integer within documented bounds (a number of nodes, minutes, moves)."""
    number = positive_int(name, value, minimum=minimum)
    if number > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value!r}")
    return number


def flag(name: str, value: object) -> bool:
    """true/false/yes/no/1/0 (or a JSON boolean)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def root_volume(name: str, value: object) -> int:
    size = positive_int(name, value, minimum=1)
    if size < MIN_ROOT_VOLUME_GIB:
        raise ConfigError(
            f"{name} must be at least {MIN_ROOT_VOLUME_GIB} GiB (the Deep Learning AMI's "
            f"root file system does not fit in less; EC2 also refuses any size below the "
            f"AMI's root snapshot, which only the deploy knows: aws ec2 describe-images "
            f"--image-ids <ami> --query 'Images[0].BlockDeviceMappings', the root device's "
            f"Ebs.VolumeSize), "
            f"got {value!r}"
        )
    if size > MAX_ROOT_VOLUME_GIB:
        raise ConfigError(f"{name} must be at most {MAX_ROOT_VOLUME_GIB} GiB (gp3's largest "
                          f"volume), got {value!r}")
    return size


def cidr(name: str, value: str) -> str:
    if Token.is_unresolved(value):
        return value
    try:
        net = ipaddress.ip_network(str(value), strict=True)
    except ValueError as exc:
        raise ConfigError(
            f"{name} must be a CIDR block like 10.0.0.0/16, got {value!r} ({exc})"
        ) from None
    if net.version != 4:
        raise ConfigError(f"{name} must be an IPv4 CIDR block, got {value!r}")
    return str(net)


def ssh_cidr(name: str, value: str, *, wide_opt_in: str | None = None) -> str:
    """A CIDR for SSH to the master: never the whole internet; with ``wide_opt_in`` (the name
    of the setting that allows it, for the message) also nothing wider than a /16 unless the
    caller passed ``wide_opt_in=""`` because the user opted in."""
    block = cidr(name, value)
    if Token.is_unresolved(block):
        return block
    prefix = ipaddress.ip_network(block).prefixlen
    if prefix == 0:
        raise ConfigError(
            f"{name} must not open SSH to the whole internet, got {value!r}; "
            "give your own address range (e.g. 203.0.113.7/32) or leave it unset "
            "and connect with SSM Session Manager"
        )
    if wide_opt_in and prefix < MAX_SSH_PREFIX_WIDTH:
        raise ConfigError(
            f"{name} opens SSH to {2 ** (32 - prefix):,} addresses, wider than the "
            f"/{MAX_SSH_PREFIX_WIDTH} limit, got {value!r}; give a narrower range, or set "
            f"{wide_opt_in}=true if you mean it"
        )
    return block


def vpc_cidr(name: str, value: str) -> str:
    block = cidr(name, value)
    if not Token.is_unresolved(block) and not 16 <= ipaddress.ip_network(block).prefixlen <= 24:
        raise ConfigError(f"{name} must have a prefix between /16 and /24, got {value!r}")
    return block


def _matching(name: str, value: object, pattern: re.Pattern[str], must: str) -> str:
    """``value`` if it is a token or a string ``pattern`` matches, else ConfigError
    ``<name> must <must>, got <value>``: the check of every id and name with one shape."""
    if isinstance(value, str) and Token.is_unresolved(value):
        return value
    if not isinstance(value, str) or not pattern.match(value):
        raise ConfigError(f"{name} must {must}, got {value!r}")
    return value


def file_system_id(name: str, value: object) -> str:
    return _matching(name, value, _FS_ID, "look like fs-0123456789abcdef0")


def ami_id(name: str, value: object) -> str:
    return _matching(name, value, _AMI_ID, "look like ami-0123456789abcdef0")


_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8,17}$")


def vpc_id(name: str, value: object) -> str:
    return _matching(name, value, _VPC_ID, "look like vpc-0123456789abcdef0")


def subnet_ids(name: str, value: object) -> tuple[str, ...]:
    """A non-empty list of distinct subnet ids (comma-separated, or a sequence)."""
    return _distinct(name, value, _SUBNET_ID, listing="subnet ids like subnet-0123456789abcdef0",
                     one="a subnet")


def instance_type(name: str, value: object) -> str:
    """The name of an EC2 instance type such as g5.xlarge (family.size), given as a string
    or an ``ec2.InstanceType``."""
    if isinstance(value, ec2.InstanceType):
        value = value.to_string()
    return _matching(name, value, _INSTANCE_TYPE, "be an EC2 instance type like g5.xlarge "
                     "(family.size, the size one of nano, micro, small, medium, large, xlarge, "
                     "<N>xlarge, metal)")


def mount_point(name: str, value: str) -> str:
    """An absolute directory outside the system's and the node software's directories."""
    if not _MOUNT_POINT.match(str(value)) or str(value) == "/" or ".." in str(value).split("/") \
            or "." in str(value).split("/"):
        raise ConfigError(
            f"{name} must be an absolute directory path such as /efs, got {value!r}"
        )
    path = re.sub("/+", "/", str(value)).rstrip("/")
    for system in SYSTEM_DIRECTORIES:
        if path == system or path.startswith(system + "/") or system.startswith(path + "/"):
            raise ConfigError(
                f"{name} must not be on, under or above the system directory {system} "
                f"(a mount there hides what the node needs), got {value!r}; use e.g. /efs"
            )
    return path


def one_line(name: str, value: object) -> str:
    """A command (or script path) the nodes run: one non-empty line without NUL, since it
    travels as one argument through the user data and a systemd ExecStart line."""
    if isinstance(value, str) and Token.is_unresolved(value):
        return value
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "\n\r\x00"):
        raise ConfigError(
            f"{name} must be one non-empty line (a command or a script path), got {value!r}"
        )
    return value.strip()


def one_of(name: str, value: str, choices: list[str] | tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def checksum_mode(name: str, value: object) -> str:
    """A cluster's default ``dl-run --data-checksums`` (``dataChecksums``,
    ``emrDataChecksums``, the constructs' ``data_checksums``): one of the modes the node's
    reader knows (``bootstrap_scripts.data.checksums.MODES``), checked here so that both
    stacks refuse the same values with the same words."""
    return one_of(name, str(value), checksums.MODES)


# -- capacity: instance-type lists, zones, reservations (docs/capacity-adjuster.md) --------------

#: A Capacity Reservation (and a Capacity Block, which is one) id: ``cr-`` + 17 hex digits.
_RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{17}$")
#: A Resource Groups group ARN (the kind a Capacity Reservation group is).
_RESOURCE_GROUP_ARN = re.compile(
    r"^arn:aws[a-z-]*:resource-groups:[a-z]{2}(-[a-z]+)+-\d:\d{12}:group/[A-Za-z0-9_.-]{1,300}$")
#: An availability zone name such as us-east-1a (Local Zones are not for training nodes).
_ZONE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")


def _items(value: object) -> list[object]:
    """A comma-separated string (context) or a sequence (construct prop) as a list."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",")]
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def instance_types(name: str, value: object) -> tuple[str, ...]:
    """An ordered, non-empty list of distinct instance types (first preferred), given as a
    comma-separated string or a sequence of names / ``ec2.InstanceType``."""
    items = _items(value)
    if not items or items == [""]:
        raise ConfigError(f"{name} must list at least one instance type, got {value!r}")
    names = tuple(instance_type(name, item) for item in items)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{name} lists {', '.join(duplicates)} more than once, got {value!r}")
    if len(names) > 20:  # MixedInstancesPolicy takes at most 20 overrides
        raise ConfigError(f"{name} may list at most 20 instance types, got {len(names)}")
    return names


def availability_zones(name: str, value: object) -> tuple[str, ...]:
    """An ordered list of distinct availability zone names (first preferred)."""
    return _distinct(name, value, _ZONE, listing="availability zones like us-east-1a,us-east-1b",
                     one="a zone")


def _distinct(name: str, value: object, pattern: re.Pattern[str], *, listing: str,
              one: str) -> tuple[str, ...]:
    """A non-empty list (comma-separated, or a sequence) of distinct names that each match
    ``pattern``; ``listing`` and ``one`` say what they are in the messages."""
    items = tuple(str(item) for item in _items(value))
    if not items or any(not pattern.match(item) for item in items):
        raise ConfigError(f"{name} must list {listing}, got {value!r}")
    if len(set(items)) != len(items):
        raise ConfigError(f"{name} lists {one} more than once, got {value!r}")
    return items


def capacity_reservation_id(name: str, value: object) -> str:
    """``cr-`` and 17 hexadecimal digits (a Capacity Reservation or a Capacity Block)."""
    return _matching(name, value, _RESERVATION_ID, "be a capacity reservation id like "
                     "cr-0123456789abcdef0 (cr- and 17 hex digits)")


def resource_group_arn(name: str, value: object) -> str:
    """The ARN of a Capacity Reservation group (an AWS Resource Groups group)."""
    return _matching(name, value, _RESOURCE_GROUP_ARN, "be a resource group ARN like "
                     "arn:aws:resource-groups:us-east-1:123456789012:group/my-reservations")


# -- S3: bucket names and key prefixes (data and checkpoints, constructs_lib/training_data.py) --

#: S3's general purpose bucket naming rules: 3-63 characters, lowercase letters, digits, dots
#: and hyphens, starting and ending with a letter or digit, not an IP address
#: (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def bucket_name(name: str, value: object) -> str:
    """An existing general purpose S3 bucket's name (S3's naming rules, above)."""
    if isinstance(value, str) and Token.is_unresolved(value):
        return value
    if (not isinstance(value, str) or not _BUCKET_NAME.match(value) or ".." in value
            or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", value)):
        raise ConfigError(
            f"{name} must be an S3 bucket name (3-63 lowercase letters, digits, dots and "
            f"hyphens, starting and ending with a letter or digit), got {value!r}")
    return value


def key_prefix(name: str, value: object) -> str:
    """A key prefix inside a bucket: "" (the whole bucket) or ``a/b/`` (a trailing ``/`` is
    added: ``data`` must not also grant ``data-private/``). No leading ``/``, no ``*`` (it
    would widen the IAM resource), no ``..`` component, one line."""
    if not isinstance(value, str) or any(c in value for c in "*?\n\r\x00") \
            or value.startswith("/") or ".." in value.split("/") or len(value) > 512:
        raise ConfigError(
            f"{name} must be a key prefix such as datasets/imagenet/ (no leading '/', no "
            f"'*' or '?', no '..'), got {value!r}")
    return value if not value or value.endswith("/") else value + "/"

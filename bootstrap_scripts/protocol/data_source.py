"""``dl-run --data s3://bucket/prefix[:/local/dir]``: what to stage, parsed in one place.

Plain Python (no boto3): the run request checks it when it is built, the stager when it
runs. The prefix is a "directory" as ``aws s3 sync`` treats one: ``s3://b/digits`` and
``s3://b/digits/`` both mean the objects under ``digits/``, staged without that part of
their keys (``digits/train.npz`` -> ``<dir>/train.npz``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootstrap_scripts.data import checksums
from bootstrap_scripts.protocol.errors import ProtocolError

#: S3's general purpose bucket naming rules (lowercase letters, digits, dots, hyphens).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class DataSourceError(ProtocolError):
    """A ``--data`` value that is not ``s3://bucket/prefix[:/local/dir]``."""


@dataclass(frozen=True)
class DataSource:
    bucket: str
    #: "" (the whole bucket) or ending with "/"
    prefix: str
    #: "" = the stager chooses (the fastest local disk)
    local_dir: str = ""

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def parse_data_source(text: str) -> DataSource:
    """``s3://bucket/prefix[:/local/dir]`` -> DataSource; DataSourceError naming the value."""
    usage = (f"--data expects s3://bucket/prefix[:/local/dir] (an absolute local "
             f"directory after the ':'), got {text!r}")
    if not isinstance(text, str) or not text.startswith("s3://") or "\n" in text:
        raise DataSourceError(usage, field="data")
    rest = text[len("s3://"):]
    local = ""
    if ":" in rest:
        rest, _, local = rest.partition(":")
        if not local.startswith("/") or "\x00" in local or ".." in local.split("/"):
            raise DataSourceError(usage, field="data")
        local = local.rstrip("/") or "/"
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise DataSourceError(f"--data: {bucket!r} is not an S3 bucket name ({usage})",
                              field="data")
    if prefix.startswith("/") or ".." in prefix.split("/") or "//" in prefix:
        raise DataSourceError(f"--data: the prefix {prefix!r} has an empty or '..' part",
                              field="data")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return DataSource(bucket, prefix, local)


def check_checksum_mode(mode: str) -> str:
    """``--data-checksums``' value, one of ``data.checksums.MODES``; DataSourceError naming
    it (the run request, ``dl-run`` and ``dlc submit`` all refuse a bad one with these
    words)."""
    if mode not in checksums.MODES:
        raise DataSourceError(f"--data-checksums must be one of {', '.join(checksums.MODES)}, "
                              f"got {mode!r}")
    return mode


def check_data_options(data: str | None, shard: bool, mode: str | None) -> DataSource | None:
    """``--data``, ``--data-shard`` and ``--data-checksums`` as one job gives them (``mode``
    None: not given, the node's default applies); the parsed ``--data`` (None without one).
    DataSourceError naming the option and value. The one statement of these rules:
    ``dl-run`` (``jobs/cli/request_args.py``) and ``dlc submit`` (``dlc/jobs.py``) both call
    it, so the laptop refuses what the master would, in the master's words."""
    if not data:
        if shard:
            raise DataSourceError("--data-shard shards what --data stages: give --data too")
        if mode is not None:
            raise DataSourceError(f"--data-checksums {mode} checks what --data stages: "
                                  f"give --data too")
        return None
    source = parse_data_source(data)
    if mode is not None:
        check_checksum_mode(mode)
    return source


#: Directories a ``--mount`` may not be on, under or above: root mounts there, and a mount
#: hides what is below it (the system's and the node software's directories; the same list
#: as the stack's mount point check, ``constructs_lib/validation.py``, but for ``/tmp``: a
#: directory of the user's own in it is fine, the shared directory itself is not).
MOUNT_REFUSED_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc",
                      "/root", "/run", "/sbin", "/snap", "/sys", "/usr", "/var/lib",
                      "/var/log", "/var/run", "/var/cache", "/var/spool", "/opt/deeplearning",
                      "/opt/pytorch", "/opt/aws")
#: The most ``--mount`` options one job may give (each is a mount-s3 process on every node).
MAX_MOUNTS = 8


def parse_mount_source(text: str) -> DataSource:
    """``dl-run --mount s3://bucket/prefix:/dir`` -> DataSource; DataSourceError naming the
    value. Unlike ``--data`` the directory is required (the mount goes exactly there) and
    may not be a system directory, nor on, under or above one: root mounts it."""
    usage = f"--mount expects s3://bucket/prefix:/dir (an absolute directory), got {text!r}"
    try:
        source = parse_data_source(text)
    except DataSourceError as exc:
        raise DataSourceError(str(exc).replace("--data", "--mount")) from None
    if not source.local_dir:
        raise DataSourceError(usage)
    path = re.sub("/+", "/", source.local_dir)
    if path in ("/", "/tmp", "/var/tmp", "/home") or "." in path.split("/"):
        raise DataSourceError(usage)
    for system in MOUNT_REFUSED_DIRS:
        if path == system or path.startswith(system + "/") or system.startswith(path + "/"):
            raise DataSourceError(f"--mount: {path} is on, under or above the system directory "
                                  f"{system}; mount into a directory of yours (e.g. "
                                  f"/home/<you>/data), got {text!r}")
    return DataSource(source.bucket, source.prefix, path)


def check_mounts(mounts: tuple[str, ...]) -> tuple[DataSource, ...]:
    """Every ``--mount`` of a job, parsed; DataSourceError for a bad one, too many, or two
    mounts on the same or nested directories (one would hide the other)."""
    if len(mounts) > MAX_MOUNTS:
        raise DataSourceError(f"--mount: at most {MAX_MOUNTS} per job, got {len(mounts)}")
    sources = tuple(parse_mount_source(m) for m in mounts)
    dirs = [s.local_dir for s in sources]
    for i, a in enumerate(dirs):
        for b in dirs[i + 1:]:
            if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                raise DataSourceError(f"--mount: {a} and {b} overlap (one mount would hide "
                                      f"the other)")
    return sources

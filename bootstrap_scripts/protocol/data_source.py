"""``dl-run --data s3://bucket/prefix[:/local/dir]``: what to stage, parsed in one place.

Plain Python (no boto3): the run request checks it when it is built, the stager when it
runs. The prefix is a "directory" as ``aws s3 sync`` treats one: ``s3://b/digits`` and
``s3://b/digits/`` both mean the objects under ``digits/``, staged without that part of
their keys (``digits/train.npz`` -> ``<dir>/train.npz``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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

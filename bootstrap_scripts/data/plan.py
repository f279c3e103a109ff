"""What a staging copies, skips and removes: a pure decision table (no I/O, no boto3).

An object is *wanted* when it is under the prefix and (with sharding) its index in key
order is this node's rank modulo the node count. A wanted object is *fetched* unless a
previous copy completed it (journal or manifest: same size and ETag) and the local file
still has that size. A file a previous copy staged that is no longer wanted is *stale*
(removed; files the stager did not write are never touched).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bootstrap_scripts.protocol.data_source import DataSource, DataSourceError, parse_data_source

#: The stager's last line: the runner reads the record that follows it from the node's log.
RESULT_MARKER = "DL_STAGE_RESULT"


class StageError(RuntimeError):
    """Staging cannot complete; the message names the bucket, prefix or object and why."""


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int
    etag: str
    #: the path under the destination (the key without the prefix)
    rel: str = ""


@dataclass
class Plan:
    wanted: list[S3Object] = field(default_factory=list)
    fetch: list[S3Object] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(o.size for o in self.wanted)

    @property
    def fetch_bytes(self) -> int:
        return sum(o.size for o in self.fetch)


def size_text(n: float) -> str:
    """``1.5 GB``, ``12.0 MB``, ``800 B``: sizes in messages."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def parse_source(text: str) -> DataSource:
    try:
        return parse_data_source(text)
    except DataSourceError as exc:
        raise StageError(str(exc).strip()) from None


def relative_path(key: str, prefix: str) -> str:
    """The key's path under the destination; "" for a folder marker (``a/b/``).
    StageError for a key that would land outside it (``..``, ``.``, an empty part)."""
    rel = key[len(prefix):]
    if rel.endswith("/"):
        return ""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts) or "\x00" in rel:
        raise StageError(f"the object key {key!r} has an empty, '.' or '..' part: it cannot "
                         f"be staged as a file under the destination")
    return rel


def plan_copy(objects: list[S3Object], prefix: str, known: Mapping[str, tuple[int, str]],
              local_sizes: Callable[[dict[str, str]], Mapping[str, int]], *, rank: int = 0,
              count: int = 1) -> Plan:
    """The plan (module doc). ``known``: key -> (size, etag) a previous copy completed;
    ``local_sizes(key -> rel)``: rel -> size of those files present now."""
    if count < 1 or not 0 <= rank < count:
        raise StageError(f"node rank {rank} is not one of the {count} shard(s)")
    files = sorted((o for o in objects if o.key.startswith(prefix)), key=lambda o: o.key)
    ordered = [S3Object(o.key, o.size, o.etag, rel) for o in files
               if (rel := relative_path(o.key, prefix))]
    wanted = [o for i, o in enumerate(ordered) if i % count == rank]
    rels = {o.key: o.rel for o in wanted}
    sizes = local_sizes(rels)
    fetch = [o for o in wanted
             if known.get(o.key) != (o.size, o.etag) or sizes.get(o.rel) != o.size]
    wanted_keys = set(rels)
    wanted_rels = set(rels.values())
    stale = sorted({relative_path(k, prefix) for k in known if k.startswith(prefix)
                    and k not in wanted_keys} - wanted_rels - {""})
    return Plan(wanted=wanted, fetch=fetch, stale=stale)

"""Which checkpoints are complete, which one a (re)start resumes from, and what the mirror
uploads next: a pure decision table (no I/O, no boto3).

A **checkpoint** is a set of data files plus its **manifest**, ``<name>.manifest.json``,
written last (temporary name, then rename) in the same directory (docs/protocol.md,
"Checkpoint manifests")::

    {"format": "dl-checkpoint/1", "name": "step-000120", "global_step": 120,
     "written_at": 1732550000.0, "files": [{"path": "step-000120.pt", "size": 123456}],
     "meta": {"epoch": 2, "step": 40}}

It is **complete** when its manifest parses and every file it lists is there with the
listed size. Data files no manifest lists are an unfinished (or pruned) checkpoint:
ignored, and reported. The **newest** complete checkpoint is the one with the highest
``global_step`` (then the later ``written_at``); on a tie EFS wins (nothing to fetch).

The same rules hold for the EFS directory and for its S3 mirror, so the mirror uploads a
checkpoint's data files first and its manifest last: an S3 listing, like a directory
listing, never shows a complete checkpoint that is not.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bootstrap_scripts.protocol import record_base

FORMAT = "dl-checkpoint/1"
MANIFEST_SUFFIX = ".manifest.json"
#: A checkpoint's name: a word (it names the manifest file), never a path.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: The S3 URL of a checkpoint prefix: ``s3://bucket/prefix`` (a bucket name as S3 allows).
S3_URL_RE = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?")
#: Where a checkpoint was found.
EFS, S3 = "efs", "s3"


class CheckpointError(ValueError):
    """A manifest, name or URL that cannot be used; the message names the value."""


@dataclass(frozen=True)
class Manifest:
    name: str
    global_step: int
    written_at: float
    files: tuple[tuple[str, int], ...]
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def manifest_file(self) -> str:
        return self.name + MANIFEST_SUFFIX

    @property
    def order(self) -> tuple[int, float]:
        return (self.global_step, self.written_at)

    def render(self) -> str:
        return json.dumps({"format": FORMAT, "name": self.name, "global_step": self.global_step,
                           "written_at": self.written_at, "meta": self.meta,
                           "files": [{"path": p, "size": s} for p, s in self.files]},
                          sort_keys=True) + "\n"


@dataclass(frozen=True)
class Survey:
    """What one place (EFS directory or S3 prefix) holds."""

    complete: tuple[Manifest, ...] = ()
    #: (manifest or file name, why it is not a complete checkpoint)
    ignored: tuple[tuple[str, str], ...] = ()

    @property
    def newest(self) -> Manifest | None:
        return max(self.complete, key=lambda m: m.order, default=None)


@dataclass(frozen=True)
class ResumeChoice:
    """The checkpoint a (re)start resumes from: ``where`` (EFS or S3), ``source`` (the EFS
    directory or the S3 URL it was found at); ``fetch``: copy it to EFS first."""

    manifest: Manifest | None
    where: str = ""
    source: str = ""

    @property
    def fetch(self) -> bool:
        return self.manifest is not None and self.where == S3


def check_path(path: str) -> str:
    """A file of a checkpoint, relative to its directory: no ``..``, ``.``, empty part or
    leading ``/``."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise CheckpointError(f"checkpoint file {path!r} is not a path inside the checkpoint "
                              f"directory")
    return path


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name) or name.endswith(MANIFEST_SUFFIX):
        raise CheckpointError(f"checkpoint name {name!r}: letters, digits, '.', '_' or '-' "
                              f"(at most 128), starting with a letter or digit")
    return name


def new_manifest(name: str, global_step: int, written_at: float,
                 files: Iterable[tuple[str, int]], meta: Mapping | None = None) -> Manifest:
    """A manifest (validated) for ``files`` (relative path, size in bytes)."""
    listed = tuple((check_path(p), int(s)) for p, s in files)
    if not listed:
        raise CheckpointError(f"checkpoint {name!r} lists no file")
    if global_step < 0 or not math.isfinite(written_at):
        raise CheckpointError(f"checkpoint {name!r}: global_step {global_step!r} must be >= 0 "
                              f"and written_at {written_at!r} a time")
    return Manifest(check_name(name), int(global_step), float(written_at), listed,
                    dict(meta or {}))


def parse_manifest(text: str, file_name: str) -> Manifest:
    """The manifest in ``text``, read from ``file_name`` (which must be ``<name>`` +
    :data:`MANIFEST_SUFFIX`); CheckpointError naming the file and what is wrong."""
    try:
        data = record_base.loads(text)
        if data.get("format") != FORMAT:
            raise CheckpointError(f"format {data.get('format')!r} is not {FORMAT!r}")
        m = new_manifest(str(data["name"]), int(data["global_step"]),
                         float(data["written_at"]),
                         ((str(f["path"]), int(f["size"])) for f in data["files"]),
                         data.get("meta") if isinstance(data.get("meta"), dict) else {})
    except CheckpointError as exc:
        raise CheckpointError(f"manifest {file_name}: {exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError) as exc:
        raise CheckpointError(f"manifest {file_name} is malformed: {exc!r}") from None
    if m.manifest_file != file_name.rsplit("/", 1)[-1]:
        raise CheckpointError(f"manifest {file_name} names checkpoint {m.name!r}, not its own")
    if any(s < 0 for _, s in m.files):
        raise CheckpointError(f"manifest {file_name} lists a negative size")
    return m


def survey(manifests: Mapping[str, str], sizes: Mapping[str, int]) -> Survey:
    """The complete checkpoints among ``manifests`` (manifest file name -> its text) given
    the data files present (relative path -> size), and what is ignored and why: a manifest
    that does not parse or whose files are missing or of another size, and data files that
    no manifest lists (a checkpoint whose manifest is missing)."""
    complete, ignored, listed = [], [], set()
    for file_name, text in sorted(manifests.items()):
        try:
            m = parse_manifest(text, file_name)
        except CheckpointError as exc:
            ignored.append((file_name, str(exc)))
            continue
        listed.update(p for p, _ in m.files)
        bad = [f"{p} ({'missing' if p not in sizes else f'{sizes[p]} bytes, not {s}'})"
               for p, s in m.files if sizes.get(p) != s]
        if bad:
            ignored.append((file_name, "incomplete: " + ", ".join(bad)))
        else:
            complete.append(m)
    for path in sorted(set(sizes) - listed):
        ignored.append((path, "no manifest lists it (an unfinished or pruned checkpoint)"))
    return Survey(tuple(sorted(complete, key=lambda m: m.order)), tuple(ignored))


def choose_resume(efs: Survey, efs_dir: str, others: Iterable[tuple[str, Survey]]
                  ) -> ResumeChoice:
    """The newest complete checkpoint of EFS (``efs_dir``) and of each S3 place (URL,
    survey); EFS wins a tie."""
    best = ResumeChoice(efs.newest, EFS, efs_dir) if efs.newest else ResumeChoice(None)
    for url, s in others:
        m = s.newest
        if m is not None and (best.manifest is None or m.order > best.manifest.order):
            best = ResumeChoice(m, S3, url)
    return best


def uploads(efs: Survey, mirrored: Mapping[str, str]) -> list[Manifest]:
    """The complete EFS checkpoints the mirror still has to upload, oldest first (so the
    newest ends up newest in S3 too): those whose manifest the mirror does not hold with
    the same text (``mirrored``: manifest file name -> text in S3)."""
    return [m for m in efs.complete if mirrored.get(m.manifest_file) != m.render()]


def upload_order(m: Manifest) -> list[str]:
    """A checkpoint's files in the order they are uploaded (or fetched): data first, the
    manifest last, so a reader never sees a manifest whose files are not there yet."""
    return [p for p, _ in m.files] + [m.manifest_file]


def parse_s3_url(url: str, what: str = "checkpoint URL") -> tuple[str, str]:
    """(bucket, prefix ending in ``/`` or "") of ``s3://bucket/prefix``."""
    match = S3_URL_RE.fullmatch(url.strip()) if isinstance(url, str) else None
    if not match:
        raise CheckpointError(f"{what} {url!r} is not s3://BUCKET/PREFIX (a bucket name of "
                              f"3-63 lower-case letters, digits, '.' or '-')")
    bucket, prefix = match.group(1), (match.group(2) or "")
    if prefix and any(p in (".", "..") for p in prefix.rstrip("/").split("/")):
        raise CheckpointError(f"{what} {url!r} has a '.' or '..' part")
    if "//" in prefix or "\x00" in prefix:
        raise CheckpointError(f"{what} {url!r} has an empty part")
    return bucket, (prefix.rstrip("/") + "/" if prefix else "")


def join_url(base: str, *parts: str) -> str:
    """``base`` (``s3://bucket/prefix/``) with ``parts`` as further prefix levels."""
    bucket, prefix = parse_s3_url(base)
    return f"s3://{bucket}/{prefix}" + "".join(f"{p}/" for p in parts)

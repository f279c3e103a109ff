"""Stage an S3 prefix onto this node's fastest local disk before a job starts.

``python -m bootstrap_scripts.data.stage s3://bucket/prefix[:/local/dir] [--shard-count N]
[--checksums warn|required]``

Run by ``dl-run --data`` on every node of the job, as the job's user (a share of its own,
before the job's: ``jobs/engine/staging.py``), so every file it writes is the user's.

Why a copy on local disk: a training job reads its dataset every epoch; local NVMe reads
at several GB/s with no per-request cost, S3 needs many parallel requests to get near that
and EFS is slower still. The copy is made once and kept: a second job on the same data
starts at once.

- **Where**: ``:/local/dir`` if given; else ``dl-data-<user>/<bucket>/<prefix>`` on the
  fastest local disk (``disks.choose_disk``: an instance-store NVMe file system if the
  instance has one mounted, else the root volume's ``/var/tmp``).
- **How**: ``fetch.Fetcher``: ``--concurrency`` GetObject requests at once on one client
  with as many connections, each object in one request (the listing gave its size and
  ETag: no HeadObject) unless it is larger than the part size (64 MiB), then in ranges;
  every request says ``If-Match`` the listed ETag.
- **Resumable, and never partial**: each object is written under a temporary name and
  renamed when complete, then journalled (``.dl-stage/journal``); the manifest
  (``.dl-stage/manifest.json``) is written last and its presence says "complete". An
  object already there with the same size and ETag (journal or manifest) is skipped, so a
  copy that was killed resumes, and a complete one costs one listing.
- **Durable before it is recorded**: a journal line is written only after a ``syncfs`` of
  the destination's file system that followed the object's rename (``State.commit``, in
  batches), and the manifest only after the last; so after a power loss no record names a
  file that is short or zero-filled (``durable``: direct I/O alone does not make a file's
  size or the device's cache durable).
- **Checksums**: the objects botocore could not check against S3's checksum (CRC64NVME or
  CRC32C without ``awscrt``, ranges, none in S3) are counted (``unverified`` in the result
  and ``staging.json``) and named in one warning line (``checksums``); with ``--checksums
  required`` the first one fails the staging instead, and no object is fetched in ranges.
- **Sharding** (``--shard-count N``): node ``DL_NODE_RANK`` stages only the objects whose
  index in key order is its rank modulo N.
- **Fails before the job, naming the cause**: a missing bucket, a denied prefix or object,
  not enough free space (checked before the first byte), a full disk while copying.
- **Region**: from the node's region file (``node_region.read_installed`` under the node
  root ``DL_ROOT``), never from the environment the job was given.

Prints progress lines and, last, ``DL_STAGE_RESULT {json}`` (objects, bytes, seconds,
GB/s, directory, unverified) that the runner records in the job's ``staging.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from bootstrap_scripts.data import disks, durable, fetch
from bootstrap_scripts.data.checksums import MODES, REQUIRED, WARN, unverified_warning
from bootstrap_scripts.data.plan import (
    RESULT_MARKER,
    Plan,
    S3Object,
    StageError,
    parse_source,
    plan_copy,
    size_text,
)
from bootstrap_scripts.data.s3_errors import client_error, object_error
from bootstrap_scripts.node import node_region

#: Objects (and ranges of large objects) transferred at once: 4 per CPU, at most 32. S3
#: needs many parallel requests per node (32 is near a 25 Gb/s NIC), but each request's
#: thread costs CPU: on 2 cores, 32 threads copied slower than 8 (the kernel's share of
#: each write grows with the writers; the bench in tests/data/test_bench_stage.py).
DEFAULT_CONCURRENCY = min(32, 4 * (os.cpu_count() or 1))
#: Seconds between progress lines.
PROGRESS_EVERY = 2.0
STATE_DIR = ".dl-stage"
MANIFEST = "manifest.json"
JOURNAL = "journal"
PART_SUFFIX = ".dl-part"
#: A journal commit (``State.commit``: one ``syncfs``, then the lines) once this many
#: objects wait, or this many seconds after the last: the lines a kill or a power loss can
#: cost (those objects are fetched again), against a disk flush per object.
COMMIT_OBJECTS = 64
COMMIT_SECONDS = 1.0


def say(message: str) -> None:
    print(f"dl-stage: {message}", flush=True)


def s3_client(region: str, concurrency: int):
    """One client for every thread (botocore clients are thread-safe), with a connection
    per concurrent request. botocore's own session, not boto3's: boto3 adds nothing the
    stager calls, and importing it (it imports s3transfer) cost about 0.15 s of a 1.5 s
    stage of 1 GB on the bench, time every job's start waits for."""
    from botocore.config import Config
    from botocore.session import get_session

    return get_session().create_client(
        "s3", region_name=region,
        config=Config(max_pool_connections=concurrency + 4,
                      retries={"max_attempts": 5, "mode": "standard"}))


def list_objects(client, bucket: str, prefix: str) -> list[S3Object]:
    """Every object under ``prefix``; StageError naming the bucket / prefix on failure."""
    out: list[S3Object] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix):
            out += [S3Object(o["Key"], int(o["Size"]), str(o["ETag"]).strip('"'))
                    for o in page.get("Contents", [])]
    except Exception as exc:  # botocore's ClientError, EndpointConnectionError, ...
        code, message = client_error(exc)
        if code == "NoSuchBucket":
            raise StageError(f"s3://{bucket}: the bucket does not exist ({code})") from None
        if code in ("AccessDenied", "403", "Forbidden"):
            raise StageError(f"s3://{bucket}/{prefix}: access denied listing the prefix "
                             f"({code}): the node may read only the stack's dataBucket "
                             f"under dataPrefix") from None
        raise StageError(f"s3://{bucket}/{prefix}: cannot list ({code}: {message})") from None
    return out


class State:
    """The copy's journal and manifest under ``<dest>/.dl-stage/``."""

    def __init__(self, dest: Path) -> None:
        self.dir = dest / STATE_DIR
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.lock = threading.Lock()
        #: held by the one thread writing journal lines (``commit``)
        self.committing = threading.Lock()
        self.fd: int | None = None
        #: renamed objects whose journal lines wait for their data to be on the disk
        self.pending: list[S3Object] = []
        self.committed_at = time.monotonic()

    def known(self) -> dict[str, tuple[int, str]]:
        """key -> (size, etag) of every object a previous copy completed."""
        known: dict[str, tuple[int, str]] = {}
        try:
            manifest = json.loads((self.dir / MANIFEST).read_text())
            known.update({k: (int(v["size"]), str(v["etag"]))
                          for k, v in manifest["objects"].items()})
        except (OSError, ValueError, KeyError, TypeError):
            pass
        try:
            for line in (self.dir / JOURNAL).read_text().splitlines():
                try:
                    rec = json.loads(line)
                    known[str(rec["key"])] = (int(rec["size"]), str(rec["etag"]))
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a kill: that object is fetched again
        except OSError:
            pass
        return known

    def incomplete(self) -> None:
        """From now on the copy is not complete: the manifest goes first."""
        (self.dir / MANIFEST).unlink(missing_ok=True)

    def journal(self, obj: S3Object) -> None:
        """Record ``obj`` (renamed to its final name) as complete, once its bytes are on the
        disk: it waits in ``pending`` for the next ``commit``, which runs when
        ``COMMIT_OBJECTS`` are waiting or ``COMMIT_SECONDS`` have passed (in the thread
        that finds it due; the others go on copying)."""
        with self.lock:
            self.pending.append(obj)
            due = (len(self.pending) >= COMMIT_OBJECTS
                   or time.monotonic() - self.committed_at >= COMMIT_SECONDS)
        if due:
            self.commit(wait=False)

    def commit(self, wait: bool = True) -> None:
        """The pending objects' data and renames to disk (one ``syncfs``), then their journal
        lines: a line is never on the disk before the bytes it vouches for (a line may be
        lost, and that object fetched again). Each line is one unbuffered append, so a
        killed copy keeps every line written (a line cut short is ignored by ``known``)."""
        if not self.committing.acquire(blocking=wait):
            return  # another thread is committing; what waits goes with the next commit
        try:
            with self.lock:
                batch, self.pending = self.pending, []
                self.committed_at = time.monotonic()
            if not batch:
                return
            durable.sync_filesystem(self.dir)
            lines = b"".join((json.dumps({"key": o.key, "size": o.size, "etag": o.etag})
                              + "\n").encode() for o in batch)
            if self.fd is None:
                self.fd = os.open(self.dir / JOURNAL,
                                  os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.write(self.fd, lines)
        finally:
            self.committing.release()

    def close(self) -> None:
        """The last pending objects committed, and the journal to disk."""
        self.commit()
        with self.committing:
            if self.fd is not None:
                os.fsync(self.fd)
                os.close(self.fd)
                self.fd = None

    def complete(self, source: str, plan: Plan) -> None:
        """The manifest, atomically and last: its presence says the copy is whole."""
        body = {"source": source, "completed_at": time.time(),
                "objects": {o.key: {"size": o.size, "etag": o.etag, "path": o.rel}
                            for o in plan.wanted}}
        tmp = self.dir / f"{MANIFEST}.tmp.{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(body, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.dir / MANIFEST)
        durable.sync_dir(self.dir)  # the manifest's name on the disk before the journal goes
        (self.dir / JOURNAL).unlink(missing_ok=True)  # the manifest now says it all


def local_sizes(dest: Path, plan_keys: dict[str, str]) -> dict[str, int]:
    """rel path -> size of the wanted files already in ``dest`` (missing ones absent)."""
    sizes = {}
    for rel in plan_keys.values():
        try:
            st = os.lstat(dest / rel)
        except OSError:
            continue
        if not os.path.islink(dest / rel):
            sizes[rel] = st.st_size
    return sizes


def remove_leftovers(dest: Path) -> None:
    """Temporary files of a copy that was killed (``name.dl-part``, and the
    ``name.dl-part.XXXXXXXX`` an older stager's transfer manager left)."""
    for dirpath, _dirs, files in os.walk(dest):
        for name in files:
            if PART_SUFFIX in name:
                Path(dirpath, name).unlink(missing_ok=True)


class Progress:
    """Bytes and objects done, printed every ``PROGRESS_EVERY`` seconds by a thread."""

    def __init__(self, total_objects: int, total_bytes: int) -> None:
        self.objects = self.bytes = 0
        self.total_objects, self.total_bytes = total_objects, total_bytes
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def add(self, nbytes: int = 0, objects: int = 0) -> None:
        with self.lock:
            self.bytes += nbytes
            self.objects += objects

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return (f"{self.objects}/{self.total_objects} objects, {self.bytes / 1e9:.2f}/"
                f"{self.total_bytes / 1e9:.2f} GB, {self.bytes / elapsed / 1e9:.2f} GB/s")

    def run(self) -> None:
        while not self.stop.wait(PROGRESS_EVERY):
            say(self.line())


def download(client, bucket: str, plan: Plan, dest: Path, state: State,
             concurrency: int, part_size: int | None = None, required: bool = False
             ) -> dict[str, str]:
    """Fetch ``plan.fetch`` into ``dest`` (temporary name, rename, journal), many objects at
    once (``fetch.Fetcher``; ``required``: checked objects only; ``part_size`` None:
    ``fetch.DEFAULT_PART_SIZE`` as it is at the call); StageError naming the first object
    that failed and why. The objects staged without a checksum check: key -> why
    (``checksums.checksum_gap``)."""
    progress = Progress(len(plan.fetch), plan.fetch_bytes)
    errors: list[str] = []

    def done(obj: S3Object, tmp: Path) -> None:
        try:
            os.replace(tmp, dest / obj.rel)
            state.journal(obj)
            progress.add(objects=1)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            errors.append(object_error(bucket, obj, exc))

    fetcher = fetch.Fetcher(client, bucket, concurrency=concurrency,
                            part_size=part_size or fetch.DEFAULT_PART_SIZE,
                            part_suffix=PART_SUFFIX, on_bytes=progress.add, on_done=done,
                            on_error=lambda obj, exc: errors.append(
                                object_error(bucket, obj, exc)), require_checksums=required)
    printer = threading.Thread(target=progress.run, daemon=True)
    printer.start()
    try:
        fetcher.run(plan.fetch, dest)
    finally:
        progress.stop.set()
        try:
            state.close()
        except OSError as exc:  # the last commit's syncfs: EIO, the disk lost writes
            errors.append(f"{dest}: cannot flush the copy to the disk: {exc.strerror}")
    if errors:
        remove_leftovers(dest)
        raise StageError(errors[0] + (f" (and {len(errors) - 1} more object(s))"
                                      if len(errors) > 1 else ""))
    return fetcher.unverified


def stage(source_text: str, *, root: str, rank: int, shard_count: int,
          concurrency: int, client=None, checksums: str = WARN) -> dict:
    """Stage the source; the result record (also printed). StageError on failure (with
    ``checksums`` ``required``: also the first object botocore could not check)."""
    source = parse_source(source_text)
    region = node_region.read_installed(root)
    if not region:
        raise StageError(f"no AWS region in {node_region.env_file(root)}: the node's "
                         f"installer writes it from instance metadata")
    dest = Path(source.local_dir) if source.local_dir else disks.default_destination(
        root, source.bucket, source.prefix)
    disks.make_own_dir(dest)
    client = client or s3_client(region, concurrency)
    started = time.monotonic()
    objects = list_objects(client, source.bucket, source.prefix)
    state = State(dest)
    plan = plan_copy(objects, source.prefix, state.known(),
                     lambda rels: local_sizes(dest, rels), rank=rank, count=shard_count)
    if not plan.wanted:
        raise StageError(f"{source.url}: no objects to stage"
                         + (f" for shard {rank} of {shard_count}" if shard_count > 1 else ""))
    say(f"{source.url} -> {dest}: {len(plan.wanted)} object(s), {size_text(plan.total_bytes)}; "
        f"{len(plan.fetch)} to copy ({size_text(plan.fetch_bytes)}), "
        f"{len(plan.wanted) - len(plan.fetch)} already here")
    unverified: dict[str, str] = {}
    if plan.fetch:
        state.incomplete()
        remove_leftovers(dest)
        disks.check_space(dest, plan.fetch_bytes, len(plan.fetch))
        unverified = download(client, source.bucket, plan, dest, state, concurrency,
                              required=checksums == REQUIRED)
    for rel in plan.stale:
        (dest / rel).unlink(missing_ok=True)  # staged before, no longer in the source
    state.complete(source.url, plan)
    seconds = time.monotonic() - started
    result = {"source": source.url, "directory": str(dest), "objects": len(plan.wanted),
              "copied": len(plan.fetch), "bytes": plan.total_bytes,
              "copied_bytes": plan.fetch_bytes, "seconds": round(seconds, 3),
              "gbps": round(plan.fetch_bytes / max(seconds, 1e-9) / 1e9, 4),
              "shard": f"{rank}/{shard_count}" if shard_count > 1 else "",
              "unverified": len(unverified)}
    if warning := unverified_warning(unverified, len(plan.fetch)):
        say(warning)
    say(f"staged {result['objects']} object(s) in {dest}: copied {result['copied']} "
        f"({size_text(plan.fetch_bytes)}) in {seconds:.1f} s, {result['gbps']:.3f} GB/s")
    print(f"{RESULT_MARKER} {json.dumps(result, sort_keys=True)}", flush=True)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dl-stage", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="s3://bucket/prefix[:/local/dir]")
    p.add_argument("--shard-count", type=int, default=1,
                   help="stage only this node's share of the objects (rank $DL_NODE_RANK)")
    p.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                   help=f"transfers at once (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--checksums", choices=MODES, default=WARN,
                   help="required: fail on the first object botocore cannot check against "
                   "S3's checksum (default: stage it and warn)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    count = max(1, args.shard_count)
    try:
        # the node's rank matters only when the objects are shared out among the nodes
        rank = int(os.environ.get("DL_NODE_RANK", "0")) if count > 1 else 0
        stage(args.source, root=os.environ.get("DL_ROOT") or "/", rank=rank,
              shard_count=count, concurrency=max(1, args.concurrency),
              checksums=args.checksums)
    except StageError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Copy listed S3 objects into files with as little client CPU per byte as possible.

Why not boto3's transfer manager: profiled against ``aws s3 sync`` on the same objects, it
spent as much CPU per byte as the S3 server it read from: a HeadObject per object for a
size and ETag the listing had already given, 256 KiB reads handed from a network thread to
a file-writing thread through a queue, and a progress callback per read. Here each
transfer is one GetObject whose body is read with ``readinto`` into the thread's own 1 MiB
buffer and written with ``os.pwrite`` at its offset by the same thread: no copy into new
bytes objects, no queue, no second thread per byte. botocore still signs, retries the
request and validates the object's checksum when S3 returns one for the whole object in
an algorithm it can compute (CRC32, SHA-1, SHA-256; CRC32C and CRC64NVME only with
``awscrt``, which the nodes do not install: docs/runner.md says why); the objects it could
not check are noted in ``unverified`` (``checksums.checksum_gap``). Kept on purpose:
``If-Match`` and the size say which object and how long, only the checksum says the bytes
on disk are the bytes S3 stored; zlib's CRC32 costs about 0.3 s of one core per GB.

- **Direct I/O**: the temporary files are opened with ``O_DIRECT`` and written a whole
  (page-aligned, ``mmap``) buffer at a time, so the bytes go from the buffer to the disk
  without a CPU copy into the page cache; only an object's last, unaligned bytes go through
  the cache. Profiled on the bench (tests/data/test_bench_stage.py), that copy was the
  largest part of the stager's CPU: on a VM each page-cache page is memory the guest may
  never have touched (or handed back to the host), and the first touch is what costs. The
  trade: the staged copy is not left in the page cache, so a job's first epoch reads it
  from the disk (instance-store NVMe: GB/s), where buffered writes would have left up to
  RAM's worth cached. A file system that refuses direct I/O (EINVAL) gets buffered writes.

- **Whole objects by default**: the listing gave every size, so an object is fetched with
  one request; only an object larger than ``part_size`` is split into ranges of that size
  (large ranges: S3's guidance is 8-16 MB at least, and every request is billed), so one
  huge object still uses many connections.
- **The object staged is the object listed**: every request carries ``If-Match`` with the
  listed ETag (S3 answers 412 if the object changed since), so the ETag the journal records
  is the ETag of the bytes on disk, and the ranges of one object never mix two versions.
- **Only checked bytes, on request** (``require_checksums``, ``--data-checksums
  required``): every object is fetched whole (no ranges: S3 sends no checksum for a range),
  and the first response botocore will not check (``checksums.Unverifiable``) fails its
  object before a byte of it is read and stops the fetch: the objects not yet started are
  dropped (their temporary files removed, neither done nor failed), those in flight finish.
- **Retries of a broken body**: botocore retries a request that fails; a body cut off
  while being read is read again from its start (``ATTEMPTS`` times).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bootstrap_scripts.data.checksums import Unverifiable, checksum_gap
from bootstrap_scripts.data.plan import S3Object

#: Objects larger than this are fetched in ranges of this size, in parallel.
DEFAULT_PART_SIZE = 64 * 2**20
#: Each thread's read buffer.
BUFFER_SIZE = 2**20
#: Reads of one body (the first and the retries after it was cut off).
ATTEMPTS = 3
#: Direct I/O's alignment of offsets, lengths and buffers: a multiple of the logical block
#: size of every disk the stager meets (512 or 4096 bytes).
ALIGN = 4096
O_DIRECT = getattr(os, "O_DIRECT", 0)


class ShortBody(IOError):
    """S3 sent fewer bytes than the listing or the range said."""


def byte_ranges(size: int, part_size: int) -> list[tuple[int, int] | None]:
    """The requests for an object of ``size`` bytes: ``[None]`` (one whole-object GET) up to
    ``part_size``, else inclusive ``(first, last)`` byte ranges of ``part_size`` each."""
    if part_size < 1:
        raise ValueError(f"part_size must be at least 1 byte, not {part_size}")
    if size <= part_size:
        return [None]
    return [(start, min(start + part_size, size) - 1) for start in range(0, size, part_size)]


def retryable(exc: Exception) -> bool:
    """A body cut off or stalled while being read (not an HTTP error: botocore has already
    retried those, and a 403 or 412 will not change)."""
    from botocore.exceptions import ReadTimeoutError, ResponseStreamingError

    return isinstance(exc, (ShortBody, ResponseStreamingError, ReadTimeoutError,
                            ConnectionError))


class Fetcher:
    """Fetch objects into ``<final>{part_suffix}`` files, ``concurrency`` requests at once.

    ``on_bytes(n)`` is called as bytes arrive (negative after a body is read again),
    ``on_done(obj, path)`` once per object when all its bytes are in the temporary file, and
    ``on_error(obj, exc)`` once per object that failed (its temporary file removed).
    ``require_checksums``: whole objects only, and a response botocore does not check is
    the object's ``Unverifiable`` error and the end of the fetch (``halted``)."""

    def __init__(self, client, bucket: str, *, concurrency: int, part_size: int,
                 part_suffix: str, on_bytes: Callable[[int], None],
                 on_done: Callable[[S3Object, Path], None],
                 on_error: Callable[[S3Object, Exception], None],
                 direct: bool = True, require_checksums: bool = False) -> None:
        self.client, self.bucket = client, bucket
        self.concurrency, self.part_size, self.part_suffix = concurrency, part_size, part_suffix
        self.on_bytes, self.on_done, self.on_error = on_bytes, on_done, on_error
        self.local = threading.local()
        self.lock = threading.Lock()
        #: key -> ranges still to finish; key -> the object's first error
        self.remaining: dict[str, int] = {}
        self.failed: dict[str, Exception] = {}
        #: key -> why botocore checked no checksum of (a request of) that object
        self.unverified: dict[str, str] = {}
        #: write with O_DIRECT (until a file system refuses it)
        self.direct = direct and bool(O_DIRECT)
        self.require_checksums = require_checksums
        #: set by the first ``Unverifiable`` object: the objects not started are dropped
        self.halted = threading.Event()
        #: keys of objects dropped (a request of theirs was not made) after ``halted``
        self.dropped: set[str] = set()

    def run(self, objects: list[S3Object], dest: Path) -> None:
        """Fetch every object (in key order, the ranges of one object together)."""
        with ThreadPoolExecutor(max_workers=self.concurrency,
                                thread_name_prefix="dl-stage") as pool:
            for obj in objects:
                tmp = Path(f"{dest / obj.rel}{self.part_suffix}")
                try:
                    tmp.parent.mkdir(parents=True, exist_ok=True)
                    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                                     0o644))
                except OSError as exc:
                    self.on_error(obj, exc)
                    continue
                ranges = ([None] if self.require_checksums
                          else byte_ranges(obj.size, self.part_size))
                self.remaining[obj.key] = len(ranges)
                for rng in ranges:
                    pool.submit(self.part, obj, tmp, rng)

    def part(self, obj: S3Object, tmp: Path, rng: tuple[int, int] | None) -> None:
        """One request of one object, then the object's completion if it was the last."""
        error: Exception | None = None
        if self.halted.is_set():
            with self.lock:
                self.dropped.add(obj.key)
        elif obj.key not in self.failed:  # an earlier range failed: the object is lost
            try:
                self.fetch(obj, tmp, rng)
            except Exception as exc:  # reported with the object's name by on_error
                error = exc
                if isinstance(exc, Unverifiable):
                    self.halted.set()
        with self.lock:
            if error is not None:
                self.failed.setdefault(obj.key, error)
            self.remaining[obj.key] -= 1
            last = self.remaining[obj.key] == 0
            dropped = obj.key in self.dropped
        if not last:
            return
        first_error = self.failed.get(obj.key)
        if first_error is None and dropped:
            tmp.unlink(missing_ok=True)
        elif first_error is None:
            self.on_done(obj, tmp)
        else:
            tmp.unlink(missing_ok=True)
            self.on_error(obj, first_error)

    def fetch(self, obj: S3Object, tmp: Path, rng: tuple[int, int] | None) -> None:
        start, last = rng if rng else (0, obj.size - 1)
        args = {"Bucket": self.bucket, "Key": obj.key, "IfMatch": f'"{obj.etag}"'}
        if rng:
            args["Range"] = f"bytes={start}-{last}"
        for attempt in range(1, ATTEMPTS + 1):
            got = [0]
            try:
                response = self.client.get_object(**args)
                if gap := checksum_gap(response, ranged=rng is not None):
                    if self.require_checksums:
                        response["Body"].close()
                        raise Unverifiable(gap)
                    with self.lock:
                        self.unverified.setdefault(obj.key, gap)
                self.read_body(response["Body"], tmp, start, got)
                if got[0] != last + 1 - start:
                    raise ShortBody(f"{got[0]} of {last + 1 - start} bytes arrived")
                return
            except Exception as exc:
                self.on_bytes(-got[0])  # those bytes are read again, or the object is lost
                if attempt == ATTEMPTS or not retryable(exc):
                    raise

    def read_body(self, body, tmp: Path, offset: int, got: list[int]) -> None:
        """Body -> file at ``offset`` through this thread's buffer, a whole buffer per write;
        ``got[0]``: the bytes written so far (kept when a read fails, for the progress
        count)."""
        buf = getattr(self.local, "buf", None)
        if buf is None:  # page-aligned (mmap), as direct I/O needs
            buf = self.local.buf = memoryview(mmap.mmap(-1, BUFFER_SIZE))
        target = Target(tmp, self)
        try:
            while filled := fill(body, buf):
                target.write(buf[:filled], offset + got[0])
                got[0] += filled
                self.on_bytes(filled)
        finally:
            target.close()
            body.close()


class Target:
    """A temporary file open for one request's bytes: with ``O_DIRECT`` while the fetcher
    may (``fetcher.direct``) and a write's offset and length are multiples of ``ALIGN``;
    the unaligned end of an object is written through the page cache."""

    def __init__(self, path: Path, fetcher: Fetcher) -> None:
        self.fetcher = fetcher
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        #: the file is open with O_DIRECT
        self.direct = False
        if fetcher.direct:
            try:
                self.fd = os.open(path, flags | O_DIRECT)
                self.direct = True
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                fetcher.direct = False  # this file system has no direct I/O
        self.fd = os.open(path, flags)

    def write(self, view: memoryview, pos: int) -> None:
        if self.direct and pos % ALIGN == 0:
            aligned = len(view) - len(view) % ALIGN
            try:
                pwrite_all(self.fd, view[:aligned], pos)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise  # ENOSPC, EIO: the object's error
                # a block larger than ALIGN, or no direct I/O after all: nothing was
                # written, buffered writes from now on, for every file of the fetcher
                self.fetcher.direct = False
                aligned = 0
            view, pos = view[aligned:], pos + aligned
        if view:
            if self.direct:
                self.buffered()
            pwrite_all(self.fd, view, pos)

    def buffered(self) -> None:
        """Through the page cache from now on (this file only)."""
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~O_DIRECT)
        self.direct = False

    def close(self) -> None:
        os.close(self.fd)


def fill(body, buf: memoryview) -> int:
    """Read until ``buf`` is full or the body has ended. The read that returns 0 is what
    makes botocore check the body's length and checksum, so an object whose size is a
    multiple of the buffer takes one more call."""
    filled = 0
    while filled < len(buf) and (n := body.readinto(buf[filled:])):
        filled += n
    return filled


def pwrite_all(fd: int, view: memoryview, pos: int) -> None:
    while view:
        written = os.pwrite(fd, view, pos)
        view, pos = view[written:], pos + written

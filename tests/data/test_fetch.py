"""The stager's fetcher (bootstrap_scripts/data/fetch.py) against a fake S3 client: which
requests it makes (no HeadObject, If-Match, ranges only past the part size), how it
assembles ranges, retries a cut-off body and reports a failed object once."""

from __future__ import annotations

import errno
import fcntl
import io
import os
import threading
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from bootstrap_scripts.data import fetch, s3_errors
from bootstrap_scripts.data.plan import S3Object


class Body(io.BytesIO):
    """A GetObject body (readinto, close: what the fetcher uses of botocore's)."""


class FakeS3:
    def __init__(self, objects: dict[str, bytes], *, cut_times: int = 0,
                 error: ClientError | None = None) -> None:
        self.objects, self.cut_times, self.error = objects, cut_times, error
        self.calls: list[tuple[str, dict]] = []
        self.lock = threading.Lock()

    def get_object(self, **args) -> dict:
        with self.lock:
            self.calls.append(("GetObject", args))
            cut = self.cut_times > 0
            self.cut_times -= 1
        if self.error is not None:
            raise self.error
        data = self.objects[args["Key"]]
        if "Range" in args:
            first, last = (int(x) for x in args["Range"].removeprefix("bytes=").split("-"))
            data = data[first:last + 1]
        return {"Body": Body(data[:len(data) // 2] if cut else data)}

    def head_object(self, **args) -> dict:  # pragma: no cover - must never be called
        raise AssertionError("the listing gave the size and ETag: no HeadObject")


def run(client: FakeS3, objects: list[S3Object], dest: Path, part_size: int):
    done, errors, progress = [], [], []
    lock = threading.Lock()

    def on_bytes(n: int) -> None:
        with lock:
            progress.append(n)

    fetcher = fetch.Fetcher(client, "b", concurrency=4, part_size=part_size,
                            part_suffix=".dl-part", on_bytes=on_bytes,
                            on_done=lambda o, tmp: done.append((o.key, tmp.read_bytes())),
                            on_error=lambda o, exc: errors.append((o.key, exc)))
    fetcher.run(objects, dest)
    return done, errors, sum(progress)


def test_byte_ranges_split_only_past_the_part_size() -> None:
    assert fetch.byte_ranges(0, 4) == [None]
    assert fetch.byte_ranges(4, 4) == [None]
    assert fetch.byte_ranges(10, 4) == [(0, 3), (4, 7), (8, 9)]
    with pytest.raises(ValueError, match="part_size must be at least 1 byte, not 0"):
        fetch.byte_ranges(10, 0)


def test_one_get_per_small_object_ranges_for_a_large_one_all_if_match(tmp_path) -> None:
    bodies = {"p/small": b"abc", "p/large": bytes(range(200)) * 5}
    client = FakeS3(bodies)
    objects = [S3Object(k, len(v), f"etag-{k}", k.removeprefix("p/")) for k, v in bodies.items()]
    done, errors, moved = run(client, objects, tmp_path, part_size=256)
    assert errors == []
    assert dict(done) == bodies
    assert moved == sum(map(len, bodies.values()))
    assert {c[0] for c in client.calls} == {"GetObject"}
    assert all(args["IfMatch"] == f'"etag-{args["Key"]}"' for _, args in client.calls)
    ranges = sorted(args.get("Range", "") for _, args in client.calls if args["Key"] == "p/large")
    assert ranges == ["bytes=0-255", "bytes=256-511", "bytes=512-767", "bytes=768-999"]
    assert next(args for _, args in client.calls if args["Key"] == "p/small").get("Range") is None


def test_a_body_cut_short_is_read_again_and_counted_once(tmp_path) -> None:
    client = FakeS3({"k": b"x" * 1000}, cut_times=2)
    done, errors, moved = run(client, [S3Object("k", 1000, "e", "k")], tmp_path, 4096)
    assert errors == [] and done == [("k", b"x" * 1000)]
    assert len(client.calls) == 3 and moved == 1000


def test_a_body_cut_short_every_time_fails_that_object_once(tmp_path) -> None:
    client = FakeS3({"k": b"x" * 1000}, cut_times=99)
    done, errors, moved = run(client, [S3Object("k", 1000, "e", "k")], tmp_path, 300)
    assert done == [] and [k for k, _ in errors] == ["k"]
    assert isinstance(errors[0][1], fetch.ShortBody)
    assert moved == 0
    assert not list(tmp_path.iterdir()), "the temporary file is removed"


def test_an_object_changed_since_the_listing_is_named_with_the_cause(tmp_path) -> None:
    error = ClientError({"Error": {"Code": "PreconditionFailed", "Message": "At least one "
                                   "of the pre-conditions you specified did not hold"}},
                        "GetObject")
    obj = S3Object("ds/a.bin", 3, "abc", "a.bin")
    _done, errors, _ = run(FakeS3({}, error=error), [obj], tmp_path, 4096)
    assert s3_errors.object_error("b", obj, errors[0][1]) == (
        "s3://b/ds/a.bin: the object changed while staging (its ETag is no longer the "
        "listed abc, PreconditionFailed): stage again")
    assert len(errors) == 1


class DirectIOSpy:
    """os.open / fcntl / os.pwrite as the fetcher calls them, recording which writes asked
    for direct I/O (``O_DIRECT`` itself is stripped before the real call, so the test runs on
    any file system)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, refuse_open: bool = False,
                 refuse_write: bool = False) -> None:
        self.direct_fds: set[int] = set()
        self.writes: list[tuple[bool, int, int]] = []  # (direct, offset, length)
        self.refuse_open, self.refuse_write = refuse_open, refuse_write
        real_open, real_fcntl, real_pwrite = os.open, fcntl.fcntl, os.pwrite

        def spy_open(path, flags, *args, **kwargs):
            if flags & fetch.O_DIRECT and self.refuse_open:
                raise OSError(errno.EINVAL, "Invalid argument")
            fd = real_open(path, flags & ~fetch.O_DIRECT, *args, **kwargs)
            if flags & fetch.O_DIRECT:
                self.direct_fds.add(fd)
            else:
                self.direct_fds.discard(fd)
            return fd

        def spy_fcntl(fd, cmd, arg=0):
            if cmd == fcntl.F_GETFL:
                return real_fcntl(fd, cmd) | (fetch.O_DIRECT if fd in self.direct_fds else 0)
            if cmd == fcntl.F_SETFL and not arg & fetch.O_DIRECT:
                self.direct_fds.discard(fd)
            return real_fcntl(fd, cmd, arg & ~fetch.O_DIRECT)

        def spy_pwrite(fd, data, offset):
            direct = fd in self.direct_fds
            if direct and self.refuse_write:
                raise OSError(errno.EINVAL, "Invalid argument")
            self.writes.append((direct, offset, len(data)))
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(fetch.os, "open", spy_open)
        monkeypatch.setattr(fetch.os, "pwrite", spy_pwrite)
        monkeypatch.setattr(fetch.fcntl, "fcntl", spy_fcntl)


SMALL_BUFFER = 16 * 1024


def test_whole_buffers_go_to_disk_with_direct_io_only_the_unaligned_end_through_the_cache(
        tmp_path, monkeypatch) -> None:
    """Direct I/O: the bytes go from the thread's buffer to the disk without being copied
    into the page cache (on the bench's VM that copy into memory never touched before was
    most of the stager's CPU). Offsets and lengths of direct writes are multiples of ALIGN;
    the last few bytes of an object are written through the page cache."""
    monkeypatch.setattr(fetch, "BUFFER_SIZE", SMALL_BUFFER)
    spy = DirectIOSpy(monkeypatch)
    body = os.urandom(5 * SMALL_BUFFER + 100)
    done, errors, moved = run(FakeS3({"k": body}), [S3Object("k", len(body), "e", "k")],
                              tmp_path, part_size=2 * SMALL_BUFFER)
    assert errors == [] and done == [("k", body)] and moved == len(body)
    direct = sorted((off, n) for d, off, n in spy.writes if d)
    cached = [(off, n) for d, off, n in spy.writes if not d]
    assert direct == [(i * SMALL_BUFFER, SMALL_BUFFER) for i in range(5)]
    assert cached == [(5 * SMALL_BUFFER, 100)]


def test_a_file_system_without_direct_io_gets_buffered_writes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(fetch, "BUFFER_SIZE", SMALL_BUFFER)
    spy = DirectIOSpy(monkeypatch, refuse_open=True)
    bodies = {f"k{i}": os.urandom(2 * SMALL_BUFFER + i) for i in range(3)}
    done, errors, _ = run(FakeS3(bodies), [S3Object(k, len(v), "e", k)
                                           for k, v in bodies.items()], tmp_path, 4096 * 64)
    assert errors == [] and dict(done) == bodies
    assert spy.writes and not any(d for d, _, _ in spy.writes)


def test_a_direct_write_refused_for_its_alignment_is_written_again_buffered(
        tmp_path, monkeypatch) -> None:
    """EINVAL from a direct write (a disk whose block is larger than ALIGN) loses no byte."""
    monkeypatch.setattr(fetch, "BUFFER_SIZE", SMALL_BUFFER)
    spy = DirectIOSpy(monkeypatch, refuse_write=True)
    body = os.urandom(3 * SMALL_BUFFER + 7)
    done, errors, moved = run(FakeS3({"k": body}), [S3Object("k", len(body), "e", "k")],
                              tmp_path, 4096 * 64)
    assert errors == [] and done == [("k", body)] and moved == len(body)
    assert sum(n for _, _, n in spy.writes) == len(body)


def test_the_real_file_system_gets_the_same_bytes(tmp_path, monkeypatch) -> None:
    """No spy: direct I/O where tmp_path's file system has it (ranges, an unaligned end)."""
    monkeypatch.setattr(fetch, "BUFFER_SIZE", SMALL_BUFFER)
    bodies = {"a": os.urandom(7 * SMALL_BUFFER + 4095), "b": os.urandom(SMALL_BUFFER),
              "c": b"x"}
    done, errors, moved = run(FakeS3(bodies), [S3Object(k, len(v), "e", k)
                                               for k, v in bodies.items()],
                              tmp_path, part_size=2 * SMALL_BUFFER)
    assert errors == [] and dict(done) == bodies and moved == sum(map(len, bodies.values()))

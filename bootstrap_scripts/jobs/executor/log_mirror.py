"""This node's share of every job's output, copied line by line to one local file that the
CloudWatch agent ships (stream ``<instance-id>/jobs``).

Why a copy: a share's output goes to EFS (``jobs/<id>/nodes/<rank>[-<label>].log``), one
file per job and rank, written by the job's processes, and the CloudWatch agent's
configuration is written once at boot; only the executor knows which of those files this
node writes. Each pass it reads the new whole lines of its running shares' logs and
appends them to :func:`jobs_log` as ``<user>/<attempt id> [<rank> <address>[ <label>]] <line>``
(the prefix ``dl-jobs logs`` and ``dlc logs`` print), so ``dlc logs --source cloudwatch``
can pick a job's lines out of every node's stream. After a share ended, what is left is
read the same way, a chunk per pass (a last line without a newline included), then the share
is forgotten.

Root reads files the job's user writes: each is opened relative to its directory's
descriptor, without following a link (``O_NOFOLLOW``, the directory too), and read only if
it is a regular file.

The bounds (a job's output is the user's to size; the executor's memory, time and the node's
disk are not): at most :data:`READ_LIMIT` bytes per file and pass, and
:data:`PASS_LIMIT` for every file of a pass, each chunk appended before the next is read,
so the executor holds at most one chunk whatever a share printed, and its loop (the node's
heartbeat) is never held by a burst; a line longer than a chunk is cut there. At most
:data:`SOURCE_COPY_LIMIT` bytes of one share log are copied (one line then says the rest is
on EFS only), and ``jobs.log`` is moved to ``jobs.log.1`` (replacing the older one) once it
passed :data:`FILE_LIMIT`: the local copy stays under twice that on disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

LOG = logging.getLogger("dl-executor.log-mirror")

#: Where the copy goes, relative to the node's root (``cloudwatch_config.sources``).
JOBS_LOG = "var/log/dl-cluster/jobs.log"
#: Bytes read from one share log per pass (the rest waits for the next pass).
READ_LIMIT = 1024 * 1024
#: Bytes read from every share log together in one pass.
PASS_LIMIT = 8 * READ_LIMIT
#: Bytes of one share log copied to ``jobs.log`` (the whole log stays on EFS).
SOURCE_COPY_LIMIT = 256 * 1024 * 1024
#: ``jobs.log``'s size past which it is moved to ``jobs.log.1`` (one older file kept).
FILE_LIMIT = 512 * 1024 * 1024


def jobs_log(root: str | Path) -> Path:
    return Path(root) / JOBS_LOG


@dataclass(frozen=True)
class Source:
    """One share log to follow: its directory and name, and the prefix of its lines."""

    job_id: str
    directory: Path
    name: str
    prefix: str


def share_sources(job_id: str, directory: Path, address: str,
                  files: Iterable[tuple[int, str, str]]) -> list[Source]:
    """The sources of one share: ``files`` are (rank, label, file name)."""
    return [Source(job_id, directory, name,
                   f"{job_id} [{rank} {address}{' ' + label if label else ''}] ")
            for rank, label, name in files]


def read_new(directory: Path, name: str, offset: int, limit: int = READ_LIMIT) -> bytes:
    """Up to ``limit`` bytes of ``directory/name`` from ``offset`` (b"" if it is missing, a
    link, or not a regular file)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(directory, flags | os.O_DIRECTORY)
    except OSError:
        return b""
    try:
        fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return b""
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


class LogMirror:
    """Follows the running shares' logs and appends their lines to the node's jobs log."""

    def __init__(self, root: str | Path) -> None:
        self.path = jobs_log(root)
        self.offsets: dict[Source, int] = {}
        #: bytes of each source copied so far (:data:`SOURCE_COPY_LIMIT`)
        self.copied: dict[Source, int] = {}
        self.turn = 0

    def lines(self, source: Source, *, final: bool) -> tuple[list[str], int, bool]:
        """The next whole lines of ``source`` (with ``final``, the rest too; a line longer
        than a chunk is cut at its end), the bytes taken, and whether more may follow (a
        whole chunk was read)."""
        offset = self.offsets.get(source, 0)
        data = read_new(source.directory, source.name, offset)
        full = len(data) >= READ_LIMIT
        cut = len(data) if (final and not full) else data.rfind(b"\n") + 1
        if cut <= 0 and full:
            cut = len(data)  # one line longer than a chunk: copied in pieces
        if cut <= 0:
            return [], 0, full
        self.offsets[source] = offset + cut
        text = data[:cut].decode(errors="replace")
        return [source.prefix + line.rstrip("\r") for line in text.splitlines()], cut, full

    def follow(self, running: Iterable[Source]) -> int:
        """One pass: the running sources' new lines, then the ended ones' rest, a chunk each
        within :data:`PASS_LIMIT`; returns how many lines were appended."""
        now = dict.fromkeys(running)  # the caller's order, each once
        for source in now:
            self.offsets.setdefault(source, 0)
        budget, appended = PASS_LIMIT, 0
        order = list(self.offsets)
        if order:  # each pass starts one source further: none starves behind a burst
            start = self.turn % len(order)
            order = order[start:] + order[:start]
            self.turn += 1
        for source in order:
            ended = source not in now
            if budget <= 0:
                break
            if self.copied.get(source, 0) >= SOURCE_COPY_LIMIT:
                if ended:
                    self.forget(source)
                continue
            found, size, more = self.lines(source, final=ended)
            budget -= size
            if found:
                self.copied[source] = self.copied.get(source, 0) + size
                if self.copied[source] >= SOURCE_COPY_LIMIT:
                    found.append(f"{source.prefix}[dl-executor] more than "
                                 f"{SOURCE_COPY_LIMIT // (1024 * 1024)} MiB of output: the "
                                 f"rest is not copied here (all of it: {source.name} on EFS)")
                self.append(found)
                appended += len(found)
            if ended and not more:  # drained
                self.forget(source)
        return appended

    def forget(self, source: Source) -> None:
        self.offsets.pop(source, None)
        self.copied.pop(source, None)

    def append(self, lines: list[str]) -> None:
        try:
            self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(self.path).st_size >= FILE_LIMIT:
                    os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            LOG.warning("cannot append to %s: %s", self.path, exc)
            return
        with contextlib.closing(os.fdopen(fd, "ab")) as f:
            f.write("".join(line + "\n" for line in lines).encode())

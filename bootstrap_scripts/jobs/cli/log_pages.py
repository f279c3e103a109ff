"""A managed job's output in pages, from a cursor: what ``dl-jobs logs ID --cursor C`` prints
for ``dlc logs`` on a laptop.

Why a cursor and not a byte offset: the job's output is several files growing at once (one
per node and share, ``jobs/<attempt>/nodes/<rank>[-<label>].log``, and the runner's
``managed/<id>/attempts/<n>.log``), so an offset into their merged text means something
else on the next read (the interleaving changes as the files grow) and lines are lost or
repeated. The cursor holds the attempt and one byte offset per file instead, each just past
the last whole line handed out, so every read goes on exactly where the previous one
stopped. A line still being written (no newline yet) is held until it is complete, or until
its attempt is over (then the rest is the last line). The caller keeps the cursor (it is
one word of the characters the cluster's Command document accepts:
``<attempt>:<file>=<offset>,…``) and nothing is stored on the node.

A page stays below :data:`PAGE_BYTES` bytes of JSON, so it fits what Run Command returns
of a command's output (24,000 characters); a line longer than :data:`MAX_LINE_BYTES`
(without a newline within it) is handed out in pieces of that size, each a line of its own.

The files are read as root (the document runs ``dl-jobs`` as the agent), and users write
them: each is opened relative to its directory's descriptor, without following a symbolic
link, and read only if it is a regular file.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts.jobs.cli.follow import restart_line
from bootstrap_scripts.jobs.engine import managed, userfiles
from bootstrap_scripts.jobs.engine.restart_policy import JobState
from bootstrap_scripts.jobs.engine.watch import LogTailer
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import (
    SHARE_LOG_SUFFIX,
    ClusterPaths,
    ManagedPaths,
    parse_share_file,
)

#: A page's lines take at most this many bytes of JSON (Run Command returns 24,000
#: characters of stdout; the rest of the answer is small).
PAGE_BYTES = 16_000
#: A longer run of bytes without a newline is cut into lines of this size.
MAX_LINE_BYTES = 2_000
#: The cursor's key for the attempt's runner messages (a node file's key starts with a digit).
RUNNER_KEY = "r"
KEY_RE = re.compile(r"^(r|[0-9]{1,6}(-[A-Za-z0-9_.-]{1,64})?)$")
CURSOR_RE = re.compile(r"^([1-9][0-9]{0,5})(:(.*))?$")


@dataclass
class Cursor:
    """Where the reader stopped: the attempt, and per file of it the byte just past the
    last whole line handed out (a file not named is read from its start)."""

    attempt: int = 1
    offsets: dict[str, int] = field(default_factory=dict)

    def encode(self) -> str:
        pairs = ",".join(f"{k}={v}" for k, v in sorted(self.offsets.items()))
        return f"{self.attempt}:{pairs}" if pairs else str(self.attempt)

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """ValueError naming what is wrong with ``text``."""
        m = CURSOR_RE.match(text)
        if m is None:
            raise ValueError(f"cursor {text!r} is not <attempt>[:<file>=<offset>,...]")
        offsets: dict[str, int] = {}
        for pair in filter(None, (m.group(3) or "").split(",")):
            key, eq, value = pair.partition("=")
            if not eq or not KEY_RE.match(key) or not value.isdigit() or len(value) > 15:
                raise ValueError(f"cursor {text!r}: {pair!r} is not <file>=<offset>")
            offsets[key] = int(value)
        return cls(int(m.group(1)), offsets)


@dataclass
class Page:
    """One answer: node lines (``out``), runner and restart lines (``err``), the cursor to
    ask with next, the job's state; ``more``: the page is full, ask again at once;
    ``done``: the job is over and everything it wrote has been handed out."""

    cursor: Cursor
    state: str
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    more: bool = False
    done: bool = False
    used: int = 0

    def fits(self, line: str) -> bool:
        cost = len(json.dumps(line, ensure_ascii=False).encode()) + 2
        if self.used + cost > PAGE_BYTES:
            return False
        self.used += cost
        return True

    def to_dict(self) -> dict:
        return {"cursor": self.cursor.encode(), "state": self.state, "done": self.done,
                "more": self.more, "out": self.out, "err": self.err}


def read_from(dir_fd: int, name: str, offset: int, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of ``name`` (in the directory ``dir_fd``) from ``offset``;
    None if it is not there or not a regular file (a link is never followed)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def whole_lines(data: bytes, *, final: bool, at_end: bool) -> Iterator[tuple[bytes, int]]:
    """(line, bytes consumed) for each line of ``data`` the reader may hand out: complete
    ones; a run of :data:`MAX_LINE_BYTES` without a newline, cut; and, when the file is
    ``final`` and ``data`` reaches its end, the unterminated rest."""
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos, pos + MAX_LINE_BYTES)
        if nl >= 0:
            yield data[pos:nl], nl + 1 - pos
            pos = nl + 1
        elif len(data) - pos >= MAX_LINE_BYTES:
            yield data[pos:pos + MAX_LINE_BYTES], MAX_LINE_BYTES
            pos += MAX_LINE_BYTES
        elif final and at_end:
            yield data[pos:], len(data) - pos
            return
        else:
            return  # a partial line: held until it is complete


class AttemptFiles:
    """The files of one attempt a page reads, in a fixed order: every node log (by name),
    then the runner's messages."""

    def __init__(self, efs: Path, paths: ManagedPaths, n: int,
                 ranks: frozenset[int] | None) -> None:
        self.job = ClusterPaths(efs).job(paths.attempt_key(n))
        self.runner_log = paths.attempt_log(n)
        self.ranks = ranks
        self.tailer: LogTailer | None = None

    def prefix(self, name: str) -> str:
        """``[rank address label] `` (the address from the job's spec or the share's start
        record: :class:`LogTailer`'s prefix, so ``dl-jobs logs`` and ``dlc logs`` agree)."""
        if self.tailer is None:
            try:  # never through a link: an operator's dl-jobs runs as root
                text = userfiles.read_owned(self.job.dir, self.job.spec.name).text
            except OSError:
                text = ""
            if text:
                try:
                    self.tailer = LogTailer(self.job.nodes, JobSpec.from_json(text))
                except ProtocolError:  # garbled by its user: its lines go unprefixed
                    self.tailer = None
        if self.tailer is None:
            return f"[{name.removesuffix(SHARE_LOG_SUFFIX)}] "
        return self.tailer.line_prefix(name)

    def node_logs(self) -> list[str]:
        try:
            names = sorted(e.name for e in os.scandir(self.job.nodes)
                           if parse_share_file(e.name, SHARE_LOG_SUFFIX) is not None)
        except OSError:
            return []
        if self.ranks is not None:
            names = [n for n in names if (parse_share_file(n, SHARE_LOG_SUFFIX) or (-1,))[0]
                     in self.ranks]
        return [n for n in names if KEY_RE.match(n.removesuffix(SHARE_LOG_SUFFIX))]


def open_dir(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None


def read_file(page: Page, dir_fd: int | None, name: str, key: str, prefix: str, *,
              final: bool, into: list[str]) -> bool:
    """Hand out the whole lines of one file from the cursor's offset while the page has
    room; True when the file is drained (nothing more to hand out now)."""
    if dir_fd is None:
        return True
    offsets = page.cursor.offsets
    while True:
        start = offsets.get(key, 0)
        data = read_from(dir_fd, name, start, PAGE_BYTES)
        if not data:
            return True
        at_end = len(data) < PAGE_BYTES
        taken = 0
        for raw, consumed in whole_lines(data, final=final, at_end=at_end):
            line = prefix + raw.decode(errors="replace").rstrip("\r")
            if not page.fits(line):
                page.more = True
                offsets[key] = start + taken
                return False
            into.append(line)
            taken += consumed
        offsets[key] = start + taken
        if at_end or taken == 0:
            return True


def read_attempt(page: Page, files: AttemptFiles, *, final: bool, prefix: bool) -> bool:
    """Every file of the attempt in turn; True when all are drained."""
    drained = True
    nodes_fd = open_dir(files.job.nodes)
    try:
        for name in files.node_logs():
            key = name.removesuffix(SHARE_LOG_SUFFIX)
            pre = files.prefix(name) if prefix else ""
            drained = read_file(page, nodes_fd, name, key, pre, final=final,
                                into=page.out) and drained
            if page.more:
                return False
    finally:
        if nodes_fd is not None:
            os.close(nodes_fd)
    if files.ranks is None:
        runner_fd = open_dir(files.runner_log.parent)
        try:
            drained = read_file(page, runner_fd, files.runner_log.name, RUNNER_KEY, "",
                                final=final, into=page.err) and drained
        finally:
            if runner_fd is not None:
                os.close(runner_fd)
    return drained and not page.more


def attempt_over(job: ManagedJob, n: int) -> bool:
    """Attempt ``n``'s runner has exited, so its files are whole: a later attempt began,
    a restart after it is recorded, or the job is over."""
    return job.attempt > n or JobState(job.state).terminal or bool(restart_line(job, n))


def read_page(efs: Path, job_id: str, cursor: Cursor, *, ranks: frozenset[int] | None = None,
              prefix: bool = True) -> Page:
    """The next page of the job's output after ``cursor`` (ManagedError for an unknown job).
    The job's record is read before its files, so files read after a finished state are
    complete."""
    paths = managed.find(efs, job_id)
    job = managed.view(paths)
    if job is None:
        raise managed.ManagedError(f"job {job_id} has no readable record")
    page = Page(Cursor(cursor.attempt, dict(cursor.offsets)), job.state)
    while True:
        n = page.cursor.attempt
        final = attempt_over(job, n)
        drained = read_attempt(page, AttemptFiles(efs, paths, n, ranks), final=final,
                               prefix=prefix)
        if not drained:
            return page
        if job.attempt > n:
            line = restart_line(job, n)
            if line and ranks is None:
                if not page.fits(line):
                    page.more = True
                    return page
                page.err.append(line)
            page.cursor = Cursor(n + 1)
            continue
        page.done = JobState(job.state).terminal and final
        return page

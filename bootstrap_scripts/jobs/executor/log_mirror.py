"""This node's share of every job's output, copied line by line to one local file that the
CloudWatch agent ships (stream ``<instance-id>/jobs``).

Why a copy: a share's output goes to EFS (``jobs/<id>/nodes/<rank>[-<label>].log``), one
file per job and rank, written by the job's processes, and the CloudWatch agent's
configuration is written once at boot; only the executor knows which of those files this
node writes. Each pass it reads the new whole lines of its running shares' logs and
appends them to :func:`jobs_log` as ``<user>/<attempt id> [<rank> <address>[ <label>]] <line>``
(the prefix ``dl-jobs logs`` and ``dlc logs`` print), so ``dlc logs --source cloudwatch``
can pick a job's lines out of every node's stream. After a share ended, one last read
takes what is left (a last line without a newline included), then the share is forgotten.

Root reads files the job's user writes: each is opened relative to its directory's
descriptor, without following a link (``O_NOFOLLOW``, the directory too), and read only if
it is a regular file; at most :data:`READ_LIMIT` bytes per file and pass.
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

    def lines(self, source: Source, *, final: bool) -> list[str]:
        """The next whole lines of ``source`` (with ``final``, the rest too)."""
        offset = self.offsets.get(source, 0)
        data = read_new(source.directory, source.name, offset)
        cut = len(data) if final and len(data) < READ_LIMIT else data.rfind(b"\n") + 1
        if cut <= 0:
            return []
        self.offsets[source] = offset + cut
        text = data[:cut].decode(errors="replace")
        return [source.prefix + line.rstrip("\r") for line in text.splitlines()]

    def follow(self, running: Iterable[Source]) -> int:
        """One pass: the running sources' new lines, the ended ones' rest; returns how many
        lines were appended."""
        now = dict.fromkeys(running)  # the caller's order, each once
        out: list[str] = []
        for source in now:
            self.offsets.setdefault(source, 0)
        for source in list(self.offsets):
            if source in now:
                out.extend(self.lines(source, final=False))
                continue
            while rest := self.lines(source, final=True):  # ended: all that is left
                out.extend(rest)
            del self.offsets[source]
        if out:
            self.append(out)
        return len(out)

    def append(self, lines: list[str]) -> None:
        try:
            self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            LOG.warning("cannot append to %s: %s", self.path, exc)
            return
        with contextlib.closing(os.fdopen(fd, "ab")) as f:
            f.write("".join(line + "\n" for line in lines).encode())

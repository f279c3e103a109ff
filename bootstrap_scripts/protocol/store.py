"""Reading and writing protocol files: one atomic writer, one reader.

EFS gives close-to-open consistency: a reader that opens a file after the writer closed
(and renamed) it sees the whole new content. So every document is written to a temp file in
the same directory and renamed into place; readers never see half a document. Readers open
files rather than ``stat()`` them: on NFS an open revalidates the name, a bare stat may be
answered from the attribute cache for up to a minute.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bootstrap_scripts.protocol.errors import ProtocolError

if TYPE_CHECKING:
    from bootstrap_scripts.protocol.record_base import Record

R = TypeVar("R", bound="Record")

#: The mode of files that carry a job's environment (its ``--env`` values): the owner reads
#: them, root (the executors, the controller) too, nobody else.
OWNER_ONLY = 0o600


def atomic_write(path: str | os.PathLike, content: str, *, mode: int = 0o644,
                 fsync: bool = True) -> bool:
    """Write ``content`` via temp file + rename. Returns False (and writes nothing) if the
    file already holds exactly ``content``: that is what makes re-applying idempotent.

    ``mode`` defaults to world-readable because the runner, the executors and the agents may
    run as different users. ``fsync=False`` skips the flush for files re-verified anyway."""
    p = Path(path)
    if _holds(p, content):
        return False
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(content)
            fh.flush()
            os.fchmod(fh.fileno(), mode)  # the file written, not whatever the name is now
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True


def _holds(p: Path, content: str) -> bool:
    """Whether the file at ``p`` already holds ``content``: read without following a link
    and without blocking (the name may be a user's link or FIFO); anything unreadable is
    simply written over."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        try:
            return stat.S_ISREG(os.fstat(fd).st_mode) and \
                fh.read(len(content.encode()) + 1) == content.encode()
        except OSError:
            return False


def write_record(path: str | os.PathLike, record: Record, *, mode: int = 0o644) -> bool:
    """Atomically write a protocol record as JSON."""
    return atomic_write(path, record.to_json(), mode=mode)


#: Every open for reading never blocks and never follows a link in the file's place: a user
#: may plant a FIFO where a record is expected in their job directory (root on a worker, in
#: cluster/), and a root daemon blocked on it would stop serving every user; a link to a
#: device or to a file of another's would be read as the record.
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


#: The most a record a node writes on EFS for others to read (a registration, an executor
#: heartbeat, a drain acknowledgement, ...) may hold: each is well under 4 KiB, and root on
#: any worker can plant a file of any size there; a reader refuses a larger one unread
#: instead of holding it in memory (the master reads every node's).
NODE_RECORD_LIMIT = 1024 * 1024

#: The most any reader of this module reads when it names no smaller bound (a membership of
#: 10,000 nodes is about 2 MiB).
TEXT_LIMIT = 64 * 1024 * 1024


class RecordTooLarge(ProtocolError):
    """A file larger than its reader's bound: refused, never read whole."""


class NotARecordFile(ProtocolError):
    """What is in a record's place is no regular file of text (a FIFO, a socket, a device,
    a directory, a link, bytes that are not UTF-8): refused, never opened further."""


def read_text(path: str | os.PathLike, *, limit: int | None = None,
              errors: str = "strict") -> str | None:
    """The file's text, or None when it does not exist. Total on whatever is in its place:
    a link, a FIFO, a socket, a device or a directory raises :class:`NotARecordFile`
    (without blocking: the open is ``O_NONBLOCK|O_NOFOLLOW`` and its type is taken from
    ``fstat``), so does text that is not UTF-8; a file larger than ``limit`` bytes
    (:data:`TEXT_LIMIT` when None) raises :class:`RecordTooLarge` naming it, having read at
    most ``limit`` + 1 bytes (its size is looked at first; a file growing meanwhile is cut
    there). Both are :class:`ProtocolError`; other failures to open are ``OSError``.
    ``errors="replace"``: a log's bytes that are not UTF-8 are shown as U+FFFD instead."""
    bound = TEXT_LIMIT if limit is None else limit
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise NotARecordFile(f"not a regular file ({os.strerror(exc.errno)})",
                                 source=str(path)) from None
        raise
    try:
        st = os.fstat(fd)  # before a file object: io refuses a directory with its own error
        if not stat.S_ISREG(st.st_mode):
            raise NotARecordFile(f"not a regular file (mode {st.st_mode:o})", source=str(path))
        data = _read_upto(fd, bound + 1) if st.st_size <= bound else b""
    finally:
        os.close(fd)
    if st.st_size > bound or len(data) > bound:
        raise RecordTooLarge(f"larger than {bound} bytes: not read", source=str(path))
    try:
        return data.decode(errors=errors)
    except UnicodeDecodeError as exc:
        raise NotARecordFile(f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                             source=str(path)) from None


def _read_upto(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``fd`` (fewer only at its end)."""
    parts, got = [], 0
    while got < limit:
        part = os.read(fd, min(limit - got, 1 << 20))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def read_record(path: str | os.PathLike, cls: type[R], *,
                limit: int | None = None) -> R | None:
    """The record at ``path``, or None when the file does not exist. A file that exists but
    does not hold a valid ``cls`` raises :class:`ProtocolError` naming the file and field
    (:class:`RecordTooLarge` when larger than ``limit`` bytes)."""
    text = read_text(path, limit=limit)
    if text is None:
        return None
    return cls.from_json(text, source=str(path))


def read_record_or_none(path: str | os.PathLike, cls: type[R], *,
                        limit: int | None = None) -> R | None:
    """Like :func:`read_record`, but a malformed or unreadable file is None too: for
    watchers that poll and simply try again (the caller decides to log)."""
    try:
        return read_record(path, cls, limit=limit)
    except (OSError, ProtocolError):
        return None


def scan_records(directory: str | os.PathLike, cls: type[R], *,
                 suffix: str = ".json") -> Iterator[tuple[str, R]]:
    """(stem, record) for every readable ``*<suffix>`` record in ``directory``. Temp files
    (dot-files) are skipped, and so are malformed ones: one bad node file must not blind
    the reader to all the others."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith(".") or not entry.name.endswith(suffix):
            continue
        record = read_record_or_none(entry.path, cls)
        if record is not None:
            yield entry.name[: -len(suffix)], record


def create_exclusive(path: str | os.PathLike, content: str) -> bool:
    """Create ``path`` with ``content`` only if it does not exist (O_EXCL): the one way for
    several nodes to claim something without a coordinator. False if it already existed."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(content)
    return True


def append_block(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` with one ``write()`` under O_APPEND, so lines of one block stay
    together when several writers append."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def exists(path: str | os.PathLike) -> bool:
    """True when ``path`` can be opened now (open, not stat: see the module docstring)."""
    try:
        os.close(os.open(path, READ_FLAGS))
    except FileNotFoundError:
        return False
    except OSError as exc:  # a directory, a link, a FIFO without writer: something is there
        if exc.errno in (errno.EISDIR, errno.ELOOP, errno.ENXIO):
            return True
        raise
    return True


@dataclass(frozen=True)
class FileStamp:
    """What a watcher compares between two looks: cheap and changes on every rename."""

    inode: int
    mtime_ns: int
    size: int


def stamp(path: str | os.PathLike) -> FileStamp | None:
    """open() + fstat() of ``path``, or None when it does not exist."""
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a link in the file's place: its own stamp, never its target's
        if exc.errno != errno.ELOOP:
            raise
        st = os.lstat(path)
        return FileStamp(st.st_ino, st.st_mtime_ns, st.st_size)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return FileStamp(st.st_ino, st.st_mtime_ns, st.st_size)


def touch_directory(path: str | os.PathLike) -> None:
    """Open a directory and close it again: asks the NFS client to revalidate it, so a file
    that appears in it is not hidden by a cached negative lookup."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY))

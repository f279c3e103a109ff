"""How root-run node code (job executors, the job controller) touches a cluster user's files.

A job's directory on EFS belongs to the user who created it: that user can replace any
entry in it at any moment, by a symlink to a file they do not own (``/etc/shadow``,
another user's spec) or by a directory of their making. Root follows links and passes
every permission check, so every path root walks into there is the user's to steer.
Three rules, applied here once:

* **What root reads** to decide on the user's behalf (a job spec, a managed request) is
  opened without following links (``O_NOFOLLOW``, relative to a directory descriptor also
  opened ``O_NOFOLLOW``), and its owner is taken from ``fstat`` of the descriptor actually
  read, never from a ``stat()`` of the name: the file must be a regular file owned by the
  owner of its directory, and that owner is the user the job runs as.
* **What root writes** there (logs, records, the runner's log, its mode) is written with
  the user's identity (:func:`as_user`): the kernel then checks the user's rights and a
  planted link leads only where the user could write anyway.
* **What root creates for a user** (their checkpoint directory) is made in a root-owned
  parent, re-opened ``O_NOFOLLOW`` and handed over with ``fchown`` (:func:`user_dir`).

The same holds for every record and marker root merely looks at there (a runner's
heartbeat, a share's exit, ``done``, ``cancel``, the controller's own ``job.json``):
:func:`read_record`, :func:`scan` and :func:`exists` read them through :func:`read_owned`,
so a link planted in their place is never opened (a link to a device or to another user's
file would otherwise be opened, and parsed, by root) and a file that is not the directory
owner's does not speak for them. Every directory on the way is opened without following a
link where its parent is writable by someone other than root (``jobs/`` is, like ``/tmp``):
a job directory that is a link leads nowhere.

:func:`as_user` switches the *effective* ids of this process and back (the real and saved
ids stay root, so the user's processes can neither signal nor trace it meanwhile): the
executor and the controller are single-threaded, so nothing else runs with those ids, and
a switch costs two system calls where a child process would cost a fork per record.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bootstrap_scripts.protocol.errors import ProtocolError

if TYPE_CHECKING:
    from bootstrap_scripts.protocol.record_base import Record

R = TypeVar("R", bound="Record")

#: the flags every open of a user's entry carries: never follow a link, never block on a FIFO
NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: the longest file root reads on a user's behalf (a spec of 10,000 nodes is far below)
MAX_READ_BYTES = 64 * 1024 * 1024


class UnsafeUserFile(OSError):
    """A user's entry root will not use: a link, not a regular file, or another owner's."""


@dataclass(frozen=True)
class Owned:
    """What was read from a user's file, and whose it is (from ``fstat`` of that read)."""

    text: str
    uid: int
    gid: int


def open_dir(path: Path) -> int:
    """A descriptor of directory ``path``, walked from ``/`` one component at a time: the
    last component is never a link, one above it only where its parent is writable by
    nobody but root (or this process's user), so no user can steer the walk through a link
    of theirs (a job directory that is a link to elsewhere, above ``nodes/``)."""
    path = Path(os.path.abspath(path))
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    last = len(path.parts) - 1
    try:
        for k, part in enumerate(path.parts[1:], start=1):
            st = os.fstat(fd)
            trusted = k < last and st.st_uid in (0, os.geteuid()) and not st.st_mode & (
                stat.S_IWGRP | stat.S_IWOTH)
            # the directories on the way are only walked through (O_PATH: search permission
            # is enough, as for a path, where O_RDONLY would also need read permission)
            access = os.O_RDONLY if k == last else os.O_PATH
            flags = access | os.O_DIRECTORY | os.O_CLOEXEC | (0 if trusted else NOFOLLOW)
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
                    raise UnsafeUserFile(exc.errno, f"{path} is a symbolic link: refusing "
                                                    "it") from None
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and not trusted:
                    raise UnsafeUserFile(exc.errno, f"{path}: a component is a symbolic "
                                                    f"link ({part}): refusing it") from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def owner_of_dir(path: Path) -> tuple[int, int]:
    """(uid, gid) of directory ``path`` itself, a link refused."""
    fd = open_dir(path)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_uid, st.st_gid


def read_owned(directory: Path, name: str, *, limit: int = MAX_READ_BYTES,
               root_too: bool = False) -> Owned:
    """``directory/name`` as its directory's owner published it: a regular file (no link)
    owned by the owner of ``directory`` (no link either). UnsafeUserFile otherwise;
    FileNotFoundError when there is no such entry yet."""
    if os.sep in name or name in ("", ".", ".."):
        raise UnsafeUserFile(0, f"not a plain file name: {name!r}")
    dfd = open_dir(directory)
    try:
        dst = os.fstat(dfd)
        try:
            fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # the name is a symlink
                raise UnsafeUserFile(exc.errno, f"{directory / name} is a symbolic link: "
                                                "refusing it") from None
            raise
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeUserFile(0, f"{directory / name} is not a regular file")
            if st.st_uid != dst.st_uid and not (root_too and st.st_uid == 0):
                raise UnsafeUserFile(0, f"{directory / name} belongs to uid {st.st_uid} but "
                                        f"its directory to uid {dst.st_uid}: refusing it")
            # a larger file is refused unread (its size first), one growing meanwhile cut
            data = fh.read(limit + 1) if limit and st.st_size <= limit else b""
    finally:
        os.close(dfd)
    if limit and (st.st_size > limit or len(data) > limit):  # 0: only looked at, not read
        raise UnsafeUserFile(0, f"{directory / name} is larger than {limit} bytes")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise UnsafeUserFile(0, f"{directory / name} is not UTF-8 text ({exc.reason} at byte "
                                f"{exc.start})") from None
    return Owned(text, st.st_uid, st.st_gid)


def read_record(path: Path, cls: type[R], *, root_too: bool = False) -> R | None:
    """The record at ``path`` in a user's directory, read as :func:`read_owned` reads
    (None when there is no such file): UnsafeUserFile for a link or another owner's file,
    ProtocolError naming the file and field for one that is not a ``cls``. ``root_too``:
    a file of root's counts as well (a record of root's own that an older version wrote
    there as root; only root can give a file to root)."""
    try:
        owned = read_owned(path.parent, path.name, root_too=root_too)
    except FileNotFoundError:
        return None
    return cls.from_json(owned.text, source=str(path))


def read_record_or_none(path: Path, cls: type[R], *, root_too: bool = False) -> R | None:
    """:func:`read_record`, None also for what is unsafe, unreadable or malformed: for
    watchers that poll (root acts on none of it)."""
    try:
        return read_record(path, cls, root_too=root_too)
    except (OSError, ProtocolError, UnicodeDecodeError):
        return None


def exists(path: Path) -> bool:
    """Whether the marker ``path`` (``done``, ``cancel``) is there as its directory's owner
    left it: a regular file of theirs, opened (never followed: see ``store.exists`` on why
    an open, not a stat) and closed without reading. A link or another user's file is no
    marker of theirs; one of root's counts (an older version wrote ``cancel`` as root, and
    only root can give a file to root)."""
    try:
        read_owned(path.parent, path.name, limit=0, root_too=True)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except UnsafeUserFile:
        return False
    return True


def scan(directory: Path, cls: type[R], *, suffix: str = ".json") -> Iterator[tuple[str, R]]:
    """(stem, record) for every ``*<suffix>`` record in a user's ``directory`` that reads
    safely (:func:`read_record_or_none`); hidden (temporary) names skipped. What is no
    record (a link, another owner's file, garbage) is passed over: one bad file must not
    blind the reader to the others."""
    try:
        names = sorted(e.name for e in os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        if name.startswith(".") or not name.endswith(suffix):
            continue
        record = read_record_or_none(directory / name, cls)
        if record is not None:
            yield name[: -len(suffix)], record


def read_from(path: Path, offset: int, limit: int = MAX_READ_BYTES) -> bytes | None:
    """Up to ``limit`` bytes of a user's file (a job's log) from ``offset``, read as
    :func:`read_owned` reads (no link, a regular file of its directory's owner); None when
    it is not there or not that. How root prints a user's logs (``dl-jobs logs``, which an
    operator's document runs as root): a log replaced by a link to ``/etc/shadow`` prints
    nothing."""
    try:
        dfd = open_dir(path.parent)
    except OSError:
        return None
    try:
        fd = os.open(path.name, os.O_RDONLY | NOFOLLOW, dir_fd=dfd)
    except OSError:
        os.close(dfd)
        return None
    try:
        st, dst = os.fstat(fd), os.fstat(dfd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != dst.st_uid:
            return None
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)
        os.close(dfd)


def groups_of(uid: int, gid: int) -> list[int]:
    """The user's supplementary groups (as a login gives them), ``[gid]`` if unknown."""
    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        return [gid]


@contextlib.contextmanager
def as_user(uid: int, gid: int) -> Iterator[None]:
    """Run the body with effective ids ``uid``/``gid`` and the user's groups (root only;
    a negative uid, or a process that is not root, or root's own jobs: unchanged)."""
    if uid < 0 or os.geteuid() != 0 or uid == 0:
        yield
        return
    saved_groups = os.getgroups()
    os.setgroups(groups_of(uid, gid))
    os.setresgid(-1, gid, -1)
    os.setresuid(-1, uid, -1)
    try:
        yield
    finally:
        os.setresuid(-1, 0, -1)
        os.setresgid(-1, 0, -1)
        os.setgroups(saved_groups)


@contextlib.contextmanager
def as_owner_of(directory: Path) -> Iterator[None]:
    """:func:`as_user` for the owner of ``directory`` (``fstat``, the directory not a
    link): how root writes a marker in a job directory it knows only by its path."""
    uid, gid = owner_of_dir(directory)
    with as_user(uid, gid):
        yield


def open_append(path: Path, mode: int = 0o644) -> int:
    """A descriptor appending to ``path`` (created with ``mode``), the last component never
    a link; call it under :func:`as_user` when ``path`` is a user's."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    os.fchmod(fd, mode)
    return fd


def user_dir(parent: Path, uid: int, gid: int, mode: int = 0o700) -> Path:
    """``parent/<user name>``, the user's own directory in the root-owned ``parent``: made
    by root if missing, handed to the user, never a link, never someone else's."""
    name = user_name(uid)
    pfd = open_dir(parent)
    try:
        pst = os.fstat(pfd)
        if pst.st_uid != os.geteuid() or pst.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeUserFile(0, f"{parent} must belong to uid {os.geteuid()} and be "
                                    f"writable by nobody else (mode {pst.st_mode & 0o7777:o})")
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=pfd)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=pfd)
    finally:
        os.close(pfd)
    try:
        st = os.fstat(fd)
        if st.st_uid != uid:
            if st.st_uid != os.geteuid():
                raise UnsafeUserFile(0, f"{parent / name} belongs to uid {st.st_uid}, "
                                        f"not {uid}: refusing it")
            os.fchown(fd, uid, gid)
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return parent / name


def user_name(uid: int) -> str:
    """The name of ``uid`` (its directory's name), the number when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def cancel_text(path: Path) -> str | None:
    """The job's ``cancel`` marker's text (its first 1 KiB; None: no marker), read as
    ``exists`` judges the marker: a regular file of the directory's owner (or of
    root's), never through a link."""
    try:
        return read_owned(path.parent, path.name, limit=1024, root_too=True).text
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError):
        # a link or another user's file is no marker; an oversized or undecodable one of
        # theirs is a marker without a reason
        return "" if exists(path) else None

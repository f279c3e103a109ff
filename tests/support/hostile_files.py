"""What a user (or root on a worker) can leave where a reader expects a record, and a guard
that turns a reader blocked on one into a test failure instead of a hung test run.

Used by the readers' fuzz harness (``tests/protocol/test_reader_fuzz.py``) and the drills
that plant such things for the real daemons (``tests/security/test_hostile_records.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path

#: Everything but a regular file of text that can sit at a record's name.
SPECIAL = ("fifo", "fifo-with-writer", "socket", "device", "directory", "link-to-record",
           "link-to-device", "dangling-link")
#: The deepest nesting a hostile document carries (what the issue found crash-looping
#: the controller).
DEEP = 100_000
#: How long a reader may take over one planted file before it counts as blocked: far above
#: any reader's time on an idle machine; only a reader waiting on a FIFO reaches it.
BLOCKED_SECONDS = 60.0


def deep_json(levels: int = DEEP, opener: str = "[") -> str:
    """Arrays (or objects) nested ``levels`` deep: valid JSON that ``json.loads`` cannot
    parse without recursing that deep."""
    if opener == "[":
        return "[" * levels + "]" * levels
    return '{"a":' * levels + "1" + "}" * levels


def clear(path: Path) -> None:
    """Remove whatever is at ``path`` (file, link, FIFO, socket, device or directory)."""
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def plant(path: Path, kind: str, *, valid: str = "") -> Callable[[], None]:
    """Put a ``kind`` of :data:`SPECIAL` at ``path`` (a link to a record holding ``valid``
    for ``link-to-record``); returns what undoes anything still open (a FIFO's writer)."""
    clear(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    undo: Callable[[], None] = lambda: None  # noqa: E731
    if kind in ("fifo", "fifo-with-writer"):
        os.mkfifo(path, 0o644)
        if kind == "fifo-with-writer":  # a writer that never writes: a read would wait
            reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(reader)

            def undo() -> None:
                os.close(writer)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(path))
    elif kind == "device":  # /dev/zero's numbers: endless bytes to a reader that reads it
        os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 5))
    elif kind == "directory":
        path.mkdir()
    elif kind == "link-to-record":
        target = path.parent / f".{path.name}.target"
        target.write_text(valid)
        os.symlink(target, path)
    elif kind == "link-to-device":
        os.symlink("/dev/zero", path)
    elif kind == "dangling-link":
        os.symlink(path.parent / ".nowhere", path)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return undo


def huge(path: Path, size: int) -> None:
    """A sparse regular file of ``size`` bytes (zeros) at ``path``: larger than any bound
    without costing the disk."""
    clear(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)


def write(path: Path, content: str | bytes) -> None:
    clear(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)


def returns(read: Callable[[], object], path: Path) -> tuple[object, BaseException | None]:
    """(what ``read()`` returned, what it raised): run in a thread so that a reader blocked
    on what is at ``path`` fails the test (AssertionError) instead of hanging it; the
    blocked thread is then let go by opening the FIFO for writing."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = read()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="reader")
    thread.start()
    thread.join(BLOCKED_SECONDS)
    if thread.is_alive():
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"{}")
            os.close(fd)
        raise AssertionError(f"the reader blocked on {path} (still in it after "
                             f"{BLOCKED_SECONDS:g} s)")
    error = out.get("error")
    return out.get("value"), error if isinstance(error, BaseException) else None



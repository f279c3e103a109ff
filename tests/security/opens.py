"""Seeing whether anyone opened a file: Linux inotify's ``IN_OPEN`` (through libc).

The drills plant links to a file of root's in place of a job's markers and records and
ask: did a root service open it? A read that goes through a link opens the target, which
inotify reports whatever the reader did with it afterwards; a refused link opens nothing.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

IN_OPEN = 0x00000020
#: struct inotify_event: int wd; uint32_t mask, cookie, len; char name[len]
EVENT = struct.Struct("iIII")


class OpenWatch:
    """Counts the opens of one file from now on (close it with :meth:`close`)."""

    def __init__(self, path: Path) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if self.libc.inotify_add_watch(self.fd, os.fsencode(path), IN_OPEN) < 0:
            os.close(self.fd)
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self.count = 0

    def opens(self) -> int:
        """How many times the file was opened since the watch began."""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return self.count
            at = 0
            while at + EVENT.size <= len(data):
                _wd, mask, _cookie, length = EVENT.unpack_from(data, at)
                self.count += bool(mask & IN_OPEN)
                at += EVENT.size + length

    def close(self) -> None:
        os.close(self.fd)

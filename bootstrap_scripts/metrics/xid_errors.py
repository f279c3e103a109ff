"""XID errors: what the NVIDIA driver writes to the kernel log when a GPU fails.

An XID is the driver's error report for a GPU, one kernel log record each, e.g.
``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.``
(NVIDIA's "XID Errors" guide lists the codes: 48 double-bit ECC, 63/64 row remapping, 74
NVLink, 79 fallen off the bus, ...). ``nvidia-smi --query-gpu`` has no field for them: the
kernel log is where they are, and the executor (root) reads it from ``/dev/kmsg``, which
returns one record per ``read`` and ``EAGAIN`` at the end when opened non-blocking
(the kernel's ``Documentation/ABI/testing/dev-kmsg``). Only records written after the reader
opened it count (it starts at the end): a node's metric is the XIDs per sample, not its
history since boot.

:func:`parse` is pure; :class:`KernelLog` reads what is new since the last call (a regular
file at the same path reads the same way: the emulated node's root has one).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

#: ``NVRM: Xid (<PCI address>): <code>, ...`` anywhere in a record's message.
XID = re.compile(r"NVRM: Xid \((?P<device>[^)]{1,64})\): (?P<code>\d{1,4})\b")
#: Reads per call at most (a flood of records must not hold the sampler).
MAX_READS = 10_000


def parse(records: list[str]) -> list[tuple[str, int]]:
    """(device, code) of each XID record among ``records`` (others are ignored)."""
    out = []
    for record in records:
        match = XID.search(record)
        if match:
            out.append((match["device"], int(match["code"])))
    return out


class KernelLog:
    """The new records of ``<root>/dev/kmsg`` at each :meth:`read`; none at all when the
    file cannot be opened (no such device, not root): :attr:`problem` says why."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / "dev" / "kmsg"
        self.fd: int | None = None
        self.problem = ""

    def _open(self) -> bool:
        if self.fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self.problem = f"cannot read {self.path}: {exc.strerror}"
            return False
        os.lseek(fd, 0, os.SEEK_END)  # only what is written from now on
        self.fd, self.problem = fd, ""
        return True

    def read(self) -> list[str] | None:
        """The records written since the last call; None when the log cannot be read."""
        if not self._open():
            return None
        chunks: list[bytes] = []
        for _ in range(MAX_READS):
            try:
                data = os.read(self.fd, 8192)
            except BlockingIOError:
                break  # /dev/kmsg: nothing more for now
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # /dev/kmsg: records overwritten before we read them
                raise
            if not data:
                break  # a regular file's end
            chunks.append(data)
        text = b"".join(chunks).decode(errors="replace")
        return [line for line in text.splitlines() if line]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

"""Watching every process of the machine while a drill's job runs: who held a given byte
string in its environment or on its command line, and with which uid.

A sampler, not a proof: a process that lives shorter than one pass over ``/proc`` can be
missed, so the drills make the processes they look for live for seconds (the job sleeps),
and mark every value they plant with a tag no other process on the machine can hold.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sighting:
    pid: int
    uids: tuple[int, ...]
    where: str  # "environ" or "cmdline"
    names: tuple[str, ...]  # environ: the variables holding the needle
    cmdline: str


def uids_of(pid: str) -> tuple[int, ...]:
    """Real, effective, saved and file-system uid of ``pid`` (() when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except OSError:
        pass
    return ()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


@dataclass
class ProcWatch:
    """Every process seen holding ``needle`` (in its environ: only those with a uid of
    ``uid``, None for none; on its command line: any process, when ``cmdline`` is set)."""

    needle: bytes
    uid: int | None = 0
    cmdline: bool = True
    seen: set[Sighting] = field(default_factory=set)
    passes: int = 0
    #: sightings count only while this is set (e.g. once the job runs) ...
    armed: threading.Event = field(default_factory=threading.Event)
    #: ... which it is as soon as this file exists, when given
    arm_on: Path | None = None

    def look(self) -> None:
        if self.arm_on is not None and self.arm_on.exists():
            self.armed.set()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            uids = uids_of(pid)
            if not uids:
                continue
            args = _read(f"/proc/{pid}/cmdline")
            shown = args.replace(b"\0", b" ").decode(errors="replace")[:300]
            if self.cmdline and self.needle in args and self.armed.is_set():
                self.seen.add(Sighting(int(pid), uids, "cmdline", (), shown))
            if self.uid is None or self.uid not in uids:
                continue
            env = _read(f"/proc/{pid}/environ")
            if self.needle in env and self.armed.is_set():
                names = tuple(sorted(e.split(b"=", 1)[0].decode(errors="replace")
                                     for e in env.split(b"\0") if self.needle in e))
                self.seen.add(Sighting(int(pid), uids, "environ", names, shown))
        self.passes += 1


@contextlib.contextmanager
def watching(watch: ProcWatch, *, armed: bool = True) -> Iterator[ProcWatch]:
    """``watch`` looking at ``/proc`` over and over in a thread for the body's length."""
    if armed:
        watch.armed.set()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            watch.look()
            stop.wait(0.05)  # a pass costs CPU the watched job needs too

    thread = threading.Thread(target=loop, name="proc-watch", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join(timeout=30)

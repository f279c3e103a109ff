"""Reading a runner's output line by line as it arrives (elastic jobs on emulated nodes):
the line patterns of tests/runner/jobs' elastic example and ``Lines``, the reader that
waits for one of them."""

from __future__ import annotations

import queue
import re
import threading
import time

START_RE = re.compile(r"^\[(\d+) (\S+)\] start world_size=(\d+) restart=(\d+) step=(\d+) "
                      r"epoch=(\d+) resumed_from=(\S+)")


EPOCH_RE = re.compile(r"^\[(\d+) (\S+)\] epoch=(\d+) acc=([\d.]+) .*world_size=(\d+)")


FIRST_RE = re.compile(r"^\[(\d+) (\S+)\] first_step rank=(\d+) world_size=(\d+) step=(\d+)")


class Lines:
    """The runner's output, line by line, with the time each line arrived."""

    def __init__(self, p) -> None:
        self.q: queue.Queue = queue.Queue()
        self.all: list[tuple[float, str]] = []
        threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p) -> None:
        for line in p.stdout:
            self.q.put((time.monotonic(), line.rstrip("\n")))
        self.q.put(None)

    def mark(self) -> int:
        return len(self.all)

    def wait_for(self, pattern: re.Pattern, pred=lambda m: True, timeout: float = 120,
                 since: int = 0):
        """The first line from index ``since`` on (lines of different nodes arrive in any
        order) matching ``pattern`` and ``pred``: (arrival time, match)."""
        deadline = time.monotonic() + timeout
        i = since
        while True:
            while i < len(self.all):
                t, line = self.all[i]
                i += 1
                m = pattern.match(line)
                if m and pred(m):
                    return t, m
            if time.monotonic() > deadline:
                break
            try:
                item = self.q.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is None:
                self.q.put(None)
                if i >= len(self.all):
                    break
                continue
            self.all.append(item)
        raise AssertionError(f"no line matching {pattern.pattern} in time; output:\n"
                             + "\n".join(x[1] for x in self.all[-60:]))

    def rest(self) -> str:
        while (item := self.q.get(timeout=120)) is not None:
            self.all.append(item)
        self.q.put(None)
        return "\n".join(x[1] for x in self.all)


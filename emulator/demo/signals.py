"""How the demo treats the signals that end it, and output nobody reads any more.

``make demo | tee demo.log`` then Ctrl-C: the terminal sends SIGINT to the whole foreground
process group, so ``tee`` dies with the demo's Python process. The demo's next write then
fails with ``BrokenPipeError``; before this module that error escaped the Ctrl-C handler and
the demo exited without tearing down the emulated cluster (whose processes run in sessions
of their own, out of the terminal's reach). Closing the terminal (SIGHUP) or ``kill`` (SIGTERM)
skipped the teardown altogether.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import sys
from collections.abc import Iterator

#: The signals that end a demo run (SIGINT already raises ``KeyboardInterrupt``).
ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def interrupting() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``KeyboardInterrupt`` like Ctrl-C, so one path tears down."""
    previous = {s: signal.signal(s, _interrupt) for s in ENDING}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def ignored() -> Iterator[None]:
    """Every ending signal ignored: the teardown runs to its end (it is bounded by its own
    grace period), and the report says what was stopped."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in ENDING}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class PipeSafeStream(io.TextIOBase):
    """A text stream over ``stream`` that turns a reader gone away (EPIPE) into silence.

    After the first broken write every later one is dropped and file descriptor 1 is pointed
    at /dev/null, so neither the rest of the run nor the interpreter's final flush fails."""

    def __init__(self, stream: io.TextIOBase) -> None:
        super().__init__()
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.stream.write(text)
                self.stream.flush()
            except OSError as exc:
                if not isinstance(exc, BrokenPipeError) and exc.errno != errno.EPIPE:
                    raise
                self._silence()
        return len(text)

    def _silence(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)

    def flush(self) -> None:
        if not self.broken:
            with contextlib.suppress(OSError):
                self.stream.flush()

    def isatty(self) -> bool:
        return not self.broken and self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


def safe_stdout() -> PipeSafeStream:
    """``sys.stdout`` wrapped, for the demo's console."""
    return PipeSafeStream(sys.stdout)

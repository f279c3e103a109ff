"""What ``dl-run`` says on stderr and the exit status it returns.

Shared by the runner's modules (preflight, watch, summary, the CLI), so that every message
has the same ``[dl-run]`` prefix and every way out has one documented status.
"""

from __future__ import annotations

import sys

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class RunError(Exception):
    """A problem that stops the job before or while it runs; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def say(msg: str) -> None:
    print(f"[dl-run] {msg}", file=sys.stderr, flush=True)

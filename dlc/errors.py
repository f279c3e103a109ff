"""The errors ``dlc`` reports and the exit code of each (docs/dlc.md, "Exit codes").

Every error names what was asked for and, where it can, what exists instead, so the next
command can be typed without looking anything up.
"""

from __future__ import annotations

EXIT_OK = 0
#: The operation ran and failed (a job failed, a remote command exited non-zero, a timeout).
EXIT_FAILED = 1
#: Bad usage: unknown option, missing argument, conflicting options (click's own code).
EXIT_USAGE = 2
#: What was named does not exist: the stack, a node, a job, the emulator's state file.
EXIT_NOT_FOUND = 3
#: AWS refused or failed: credentials, permissions, throttling, an unreachable endpoint.
EXIT_AWS = 4


class DlcError(Exception):
    """A failure ``dlc`` explains in one message; ``exit_code`` is what the shell sees."""

    exit_code = EXIT_FAILED


class UsageError(DlcError):
    exit_code = EXIT_USAGE


class NotFound(DlcError):
    exit_code = EXIT_NOT_FOUND


class AwsError(DlcError):
    exit_code = EXIT_AWS
    #: AWS's error code (AccessDenied, ...), when AWS gave one
    code = ""


def listing(items: list[str], empty: str = "none") -> str:
    """``a, b, c`` (or ``empty``) for "what exists" in an error message."""
    return ", ".join(items) if items else empty

"""Why a pull or a tag's resolution failed, in a word a team can act on (pure).

podman and skopeo end a failure with one error line from containers/image (run with
``LC_ALL=C``, so the words are the library's own). The team needs the cause, not the
library's chain of wrappers: the image is not there (a wrong tag, a deleted digest),
the node may not read it (ECR's ``AccessDenied``, a private registry without a login),
the node's disk is full, the registry did not answer, or it throttled the node (Docker
Hub's pull limit, ECR's ``ThrottlingException``). Each cause has its own exit status of
``dl-container pull``, so the job's runner and controller learn it from the exit
record alone, without reading a log the user wrote.
"""

from __future__ import annotations

import re

NOT_FOUND = "not found"
ACCESS_DENIED = "access denied"
DISK_FULL = "disk full"
UNREACHABLE = "registry unreachable"
THROTTLED = "throttled"
OTHER = "failed"

#: Checked in this order: the first match is the cause (a full disk can show up wrapped in
#: a registry's name; a 429 says "too many requests" before anything else).
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (DISK_FULL, re.compile(r"no space left on device|ENOSPC|disk quota exceeded", re.I)),
    (THROTTLED, re.compile(r"toomanyrequests|too many requests|\b429\b|rate limit|"
                           r"ThrottlingException|throttl", re.I)),
    (ACCESS_DENIED, re.compile(r"unauthorized|authentication required|access denied|"
                               r"AccessDenied|\bdenied\b|\b40[13]\b|forbidden|"
                               r"no basic auth credentials", re.I)),
    (NOT_FOUND, re.compile(r"manifest unknown|name unknown|not found|\b404\b|"
                           r"repository does not exist|does not exist|no such image", re.I)),
    (UNREACHABLE, re.compile(r"connection refused|no such host|i/o timeout|"
                             r"network is unreachable|no route to host|TLS handshake|"
                             r"connection reset|pinging container registry|dial tcp|"
                             r"server gave HTTP response|x509:|timeout exceeded|"
                             r"\b50[234]\b|EOF$", re.I)),
)

#: ``dl-container pull``'s exit status for each cause (3: a failure of no known cause).
EXIT_OF: dict[str, int] = {OTHER: 3, NOT_FOUND: 4, ACCESS_DENIED: 5, DISK_FULL: 6,
                           UNREACHABLE: 7, THROTTLED: 8}
CAUSE_OF_EXIT: dict[int, str] = {code: cause for cause, code in EXIT_OF.items()}


def cause_of(text: str) -> str:
    """The cause of a failure whose error output is ``text`` (:data:`OTHER` when none of
    the known ones fits)."""
    for cause, pattern in _PATTERNS:
        if pattern.search(text):
            return cause
    return OTHER


def last_error(text: str) -> str:
    """The line that says why: podman's and skopeo's final ``Error: …`` (or logrus's
    ``level=fatal msg=…``), else the last non-empty line; at most 300 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("Error:") or "level=fatal" in line:
            return line[:300]
    return lines[-1][:300] if lines else ""

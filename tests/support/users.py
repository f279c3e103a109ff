"""Real Linux users for tests that run something as a cluster user (root only: creating a
user needs it), and an interpreter every user can reach. Tests stop what they start: the
user is removed and modes are restored on exit."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

CAN_CREATE_USERS = os.geteuid() == 0


@contextlib.contextmanager
def cluster_user(prefix: str = "dltest") -> Iterator[pwd.struct_passwd]:
    """A new unprivileged user (own group, own home), removed afterwards."""
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name],
                   check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


@contextlib.contextmanager
def reachable(*paths: str | Path) -> Iterator[None]:
    """Every directory above ``paths`` traversable by other users (as on a DLAMI, where the
    interpreter is not under /root), then back to its mode."""
    changed: list[tuple[Path, int]] = []
    try:
        for target in paths:
            for d in Path(target).parents:
                mode = stat.S_IMODE(d.stat().st_mode)
                if not mode & stat.S_IXOTH and d not in (c[0] for c in changed):
                    changed.append((d, mode))
                    os.chmod(d, mode | stat.S_IXOTH)
        yield
    finally:
        for d, mode in reversed(changed):
            os.chmod(d, mode)

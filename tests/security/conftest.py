"""Shared fixtures of the security drills: real users against the real root services.

Each drill is an attack a cluster user could make, played by a REAL unprivileged Linux user
(``useradd``) against the job executors and the job controller running as root on an
emulated cluster (real processes, real files for EFS). Two users: the **victim** (whose
jobs and files the attack aims at) and the **attacker**; both are removed afterwards. The
drills need root (to create users and to run the services as root, as on a node); CI runs
as root. They start an emulated cluster: run them under the shared lock (CONTRIBUTING.md).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from emulator.nodes import PYTHON
from tests.support import users
from tests.support.cluster import LocalCluster
from tests.support.users import cluster_for_users, cluster_user

# The shared helpers (tests/support/users.py) under the drills' names: the interpreter every
# user can reach (a fixture), a login's environment, a dl-* program run as a user.
reachable_python = users.reachable_python
user_env = users.login_env
dl = users.dl


def new_user(role: str) -> Iterator[pwd.struct_passwd]:
    """A real unprivileged user (own group, own home) named after its ``role``, removed
    afterwards."""
    with cluster_user(f"dl{role}") as user:
        yield user


@pytest.fixture()
def victim() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("creating users and running the services as root needs root")
    yield from new_user("victim")


@pytest.fixture()
def attacker() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("creating users and running the services as root needs root")
    yield from new_user("attacker")


@pytest.fixture()
def shared_tmp() -> Iterator[Path]:
    """A directory every user may write in (like /tmp), for the drills' markers."""
    tmp = Path(tempfile.mkdtemp(prefix="dl-drill-"))
    os.chmod(tmp, 0o1777)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture()
def cluster(victim, attacker, reachable_python) -> Iterator[LocalCluster]:
    """One emulated node (the master) whose executor and job controller run as root, in
    a directory every user can reach (pytest's own temporary directory is root's)."""
    with cluster_for_users("dl-sec-", 1) as c:
        c.start_executors()
        c.start_controller()
        # the executors made both users' own jobs/<user>/ and managed/<user>/ (user_dirs)
        wait_until("the users' job directories", lambda: all(
            (c.efs / top / u.pw_name).is_dir() for top in ("jobs", "managed")
            for u in (victim, attacker)))
        yield c


def as_user(user: pwd.struct_passwd, code: str, *args: str, timeout: float = 60
            ) -> subprocess.CompletedProcess:
    """Run Python ``code`` (``sys.argv[1:]`` = ``args``) as ``user``: what that user can do."""
    return subprocess.run([PYTHON, "-c", code, *args], cwd="/", env=user_env(user), text=True,
                          capture_output=True, timeout=timeout, user=user.pw_uid,
                          group=user.pw_gid, extra_groups=[])


def wait_until(what: str, done: Callable[[], object], timeout: float = 30) -> None:
    """Poll ``done`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)

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
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.agent.install import BIN_DIR
from bootstrap_scripts.procgroup import stop_popen_group
from emulator.nodes import PYTHON, base_env
from tests.conftest import REPO_ROOT
from tests.support.cluster import LocalCluster, start_local_cluster


def new_user(role: str) -> Iterator[pwd.struct_passwd]:
    """A real unprivileged user (own group, own home), removed afterwards."""
    name = f"dl{role}{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name],
                   check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


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
def reachable_python() -> Iterator[None]:
    """The interpreter, as on a DLAMI, usable by every user: directories on its path that
    others cannot traverse (a pyenv under /root here) get o+x for the test, then back."""
    changed: list[tuple[Path, int]] = []
    try:
        for target in (Path(os.path.realpath(PYTHON)), Path(PYTHON), Path(REPO_ROOT)):
            for d in target.parents:
                mode = stat.S_IMODE(d.stat().st_mode)
                if not mode & stat.S_IXOTH and d not in (c[0] for c in changed):
                    changed.append((d, mode))
                    os.chmod(d, mode | stat.S_IXOTH)
        yield
    finally:
        for d, mode in reversed(changed):
            os.chmod(d, mode)


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
    tmp = Path(tempfile.mkdtemp(prefix="dl-sec-"))
    os.chmod(tmp, 0o755)
    c = start_local_cluster(tmp / "c", 1)
    try:
        c.start_executors()
        c.start_controller()
        # the executors made both users' own jobs/<user>/ and managed/<user>/ (user_dirs)
        wait_until("the users' job directories", lambda: all(
            (c.efs / top / u.pw_name).is_dir() for top in ("jobs", "managed")
            for u in (victim, attacker)))
        yield c
    finally:
        c.stop()
        left = c.leftovers()
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"processes left behind: {sorted(left)}"


def user_env(user: pwd.struct_passwd) -> dict[str, str]:
    """The environment a login of ``user`` would have (this repository importable)."""
    return {**base_env(), "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}


def as_user(user: pwd.struct_passwd, code: str, *args: str, timeout: float = 60
            ) -> subprocess.CompletedProcess:
    """Run Python ``code`` (``sys.argv[1:]`` = ``args``) as ``user``: what that user can do."""
    return subprocess.run([PYTHON, "-c", code, *args], cwd="/", env=user_env(user), text=True,
                          capture_output=True, timeout=timeout, user=user.pw_uid,
                          group=user.pw_gid, extra_groups=[])


def dl(c: LocalCluster, user: pwd.struct_passwd, program: str, *args: str,
       timeout: float = 180) -> tuple[int, str]:
    """``dl-run`` / ``dl-jobs`` on the master as ``user`` (output and errors together)."""
    p = subprocess.Popen([str(c.master_root / BIN_DIR / program), "--root", str(c.master_root),
                          *args], cwd=REPO_ROOT, env=user_env(user), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True, user=user.pw_uid, group=user.pw_gid,
                         extra_groups=[])
    c.runners.append(p)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_popen_group(p)
        out, _ = p.communicate()
        raise AssertionError(f"{program} timed out; output so far:\n{out}") from None
    return p.returncode, out


def wait_until(what: str, done: Callable[[], object], timeout: float = 30) -> None:
    """Poll ``done`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)

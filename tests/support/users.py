"""Real Linux users for tests that run something as a cluster user (root only: creating a
user needs it), and an interpreter every user can reach. Tests stop what they start: the
user is removed and modes are restored on exit."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.agent.install import BIN_DIR
from bootstrap_scripts.procgroup import stop_popen_group
from emulator.nodes import PYTHON, base_env
from tests.conftest import REPO_ROOT
from tests.support.cluster import LocalCluster, start_local_cluster

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
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile (a demo's --stop)
                os.chmod(d, mode)


@pytest.fixture()
def job_user() -> Iterator[pwd.struct_passwd]:
    """A real unprivileged user (own group, own home), removed afterwards."""
    with cluster_user() as user:
        yield user


@pytest.fixture()
def reachable_python() -> Iterator[None]:
    """The interpreter (and this checkout), as on a DLAMI, usable by every user."""
    with reachable(os.path.realpath(PYTHON), PYTHON, REPO_ROOT):
        yield


def login_env(user: pwd.struct_passwd) -> dict[str, str]:
    """The environment a login of ``user`` would have (this repository importable)."""
    return {**base_env(), "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}


def dl(c: LocalCluster, user: pwd.struct_passwd, program: str, *args: str,
       timeout: float = 180) -> tuple[int, str]:
    """``dl-run`` / ``dl-jobs`` on the master as ``user``, with the environment a login
    would give (output and errors together)."""
    p = subprocess.Popen([str(c.master_root / BIN_DIR / program), "--root", str(c.master_root),
                          *args], cwd=REPO_ROOT, env=login_env(user), text=True,
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


def run_as(c: LocalCluster, user: pwd.struct_passwd, *args: str, managed: bool = False
           ) -> tuple[int, str]:
    """``dl-run`` on the master as ``user`` (``--unmanaged`` unless ``managed``: then the
    master's job controller runs it)."""
    return dl(c, user, "dl-run", *(() if managed else ("--unmanaged",)), *args)


@contextlib.contextmanager
def cluster_for_users(prefix: str, n_nodes: int, **kwargs: object) -> Iterator[LocalCluster]:
    """A local cluster (``start_local_cluster``) in a directory every user can reach
    (pytest's own temporary directory is root's); the caller starts its services. On exit it
    is stopped, checked for processes left behind and removed."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        os.chmod(tmp, 0o755)
        c = start_local_cluster(tmp / "c", n_nodes, **kwargs)
        try:
            yield c
        finally:
            c.stop()
            left = c.leftovers()
            assert not left, f"processes left behind: {sorted(left)}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

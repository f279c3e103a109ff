"""Real Linux users for tests that run something as a cluster user (root only: creating a
user needs it), and an interpreter every user can reach. Tests stop what they start: the
user is removed and modes are restored on exit.

``make test`` runs the suite in several pytest-xdist worker processes at once, so what is
shared by the whole machine is taken under a file lock: ``useradd``/``userdel`` (shadow-utils
gives up at once, "cannot lock /etc/passwd", when another one holds it), and the modes
:func:`reachable` opens, which are restored only when the last worker's holder lets go."""

from __future__ import annotations

import contextlib
import fcntl
import json
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
from bootstrap_scripts.node.procgroup import start_time, stop_popen_group
from emulator.nodes import PYTHON, base_env
from tests.conftest import REPO_ROOT
from tests.support.cluster import LocalCluster, start_local_cluster

CAN_CREATE_USERS = os.geteuid() == 0
#: The machine-wide locks and the table of opened directories, for every worker and run.
#: Never removed, on purpose: another run may hold (or be about to take) a lock in it,
#: and a lock file unlinked under its holder would let a second holder in.
_SHARED = Path(tempfile.gettempdir()) / "dltest-shared"


@contextlib.contextmanager
def _machine_lock(name: str) -> Iterator[Path]:
    """An exclusive lock shared by every pytest process on this machine (the workers of one
    run, and any other run); yields the directory that holds the locks and the table."""
    _SHARED.mkdir(mode=0o700, exist_ok=True)
    with open(_SHARED / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield _SHARED


def add_user(name: str, *options: str) -> pwd.struct_passwd:
    """``useradd [options] name``, one at a time on this machine."""
    with _machine_lock("accounts"):
        subprocess.run(["useradd", *options, name], check=True, capture_output=True)
    return pwd.getpwnam(name)


def remove_user(name: str, *options: str) -> None:
    """``userdel [options] name`` (a missing user is no error), one at a time."""
    with _machine_lock("accounts"):
        subprocess.run(["userdel", *options, name], check=False, capture_output=True)


@contextlib.contextmanager
def cluster_user(prefix: str = "dltest") -> Iterator[pwd.struct_passwd]:
    """A new unprivileged user (own group, own home), removed afterwards."""
    name = f"{prefix}{secrets.token_hex(3)}"
    user = add_user(name, "--create-home", "--user-group", "--shell", "/bin/sh")
    try:
        yield user
    finally:
        remove_user(name, "--remove")


def _me() -> list[int]:
    """This process as a holder: its pid and kernel start time, so a later process that
    reuses the pid of a killed holder is not taken for it."""
    return [os.getpid(), start_time(os.getpid()) or 0]


def _alive(holder: object) -> bool:
    return (isinstance(holder, list) and len(holder) == 2
            and start_time(holder[0]) == holder[1])


@contextlib.contextmanager
def _holders() -> Iterator[dict[str, dict]]:
    """The table of directories :func:`reachable` opened: ``{dir: {"mode": first mode,
    "holders": [[pid, start time], ...]}}``, under the lock, written back on exit. A holder
    that died without letting go (a killed worker) is dropped, and its directory closed if
    it was the last."""
    with _machine_lock("reachable") as shared:
        path = shared / "reachable.json"
        held: dict[str, dict] = json.loads(path.read_text()) if path.exists() else {}
        for d in list(held):
            held[d]["holders"] = [p for p in held[d]["holders"] if _alive(p)]
        yield held
        for d in [d for d, entry in held.items() if not entry["holders"]]:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile (a demo's --stop)
                os.chmod(d, held.pop(d)["mode"])
        path.write_text(json.dumps(held))


@contextlib.contextmanager
def reachable(*paths: str | Path) -> Iterator[None]:
    """Every directory above ``paths`` traversable by other users (as on a DLAMI, where the
    interpreter is not under /root), then back to its mode once nobody needs it: the
    machine's table (:func:`_holders`) keeps each directory's first mode and who holds it,
    so one worker's exit never closes a directory another worker's test still uses."""
    mine: list[str] = []
    me = _me()
    try:
        with _holders() as held:
            for target in paths:
                for d in map(str, Path(target).parents):
                    if d in mine:
                        continue
                    if d not in held:
                        mode = stat.S_IMODE(os.stat(d).st_mode)
                        if mode & stat.S_IXOTH:
                            continue
                        held[d] = {"mode": mode, "holders": []}
                        os.chmod(d, mode | stat.S_IXOTH)
                    held[d]["holders"].append(me)
                    mine.append(d)
        yield
    finally:
        with _holders() as held:
            for d in mine:
                if d in held and me in held[d]["holders"]:
                    held[d]["holders"].remove(me)


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

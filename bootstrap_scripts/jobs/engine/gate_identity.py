"""The identity the health gate's all-reduce runs as: a system user of its own, never root.

The gate's all-reduce is a torchrun job across the nodes: its agents unpickle whatever is
in the job's rendezvous store, and its workers take part in collectives with whoever
reaches them. Run as root, any flaw there (a store another user reached, a worker port a
user fed) runs code as root on every node. So the collective runs as ``dl-gate``: a
system user with no login shell, no password and no home (``/nonexistent``), made by the
node installer on every node (``useradd --system``), with the same uid on every node
(:data:`UID`, when that uid is free; the executors run each share as the uid the master's
spec carries, and list a job only when its directory's owner is that name's uid). Nothing
else runs as it, so no user can signal, trace or feed its processes; its store is guarded
for it alone (``executor/store_guard.py``), as every job's is for its user.

The node checks (``ops.node_checks``) stay root's: they read what only root may (instance
metadata) and listen on nothing.

Where the identity cannot run the gate on a node (it does not exist, or cannot execute
the interpreter or reach EFS: an interpreter under a private home), :func:`usable` says why
and the gate runs the collective as root as before, saying so in its progress; its store
is then guarded for root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bootstrap_scripts.jobs.engine import user_dirs

#: The gate's collective's user and group.
NAME = "dl-gate"
#: Its uid and gid on every node (useradd's own choice where this one is taken).
UID = 290
HOME = "/nonexistent"


class GateIdentityError(RuntimeError):
    """The identity could not be made; the message says why."""


def lookup(name: str = NAME) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def ensure(name: str = NAME) -> str:
    """Make the system user ``name`` unless it exists (idempotent, safe to run on several
    nodes of one machine at once); returns what was done. GateIdentityError when it
    cannot be made."""
    found = lookup(name)
    if found is not None:
        return f"{name} (uid {found.pw_uid}) already there"
    if os.geteuid() != 0:
        raise GateIdentityError(f"only root can make the system user {name}")
    shell = next((s for s in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(s)),
                 "/bin/false")
    free = not taken(UID)
    group = ["groupadd", "--system", *(["--gid", str(UID)] if free else []), name]
    user = ["useradd", "--system", *(["--uid", str(UID)] if free else []), "--gid", name,
            "--no-create-home", "--home-dir", HOME, "--shell", shell,
            "--comment", "dl-cluster health gate", name]
    last = ""
    for _attempt in range(10):  # /etc/passwd is locked by someone else now and then
        for argv in (group, user):
            if shutil.which(argv[0]) is None:
                raise GateIdentityError(f"{argv[0]} is not installed: cannot make {name}")
            res = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
            last = (res.stderr or res.stdout).strip()
        found = lookup(name)
        if found is not None:
            return f"{name} (uid {found.pw_uid}) made"
        time.sleep(0.5)
    raise GateIdentityError(f"cannot make the system user {name}: {last}")


def taken(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        try:
            import grp

            grp.getgrgid(uid)
        except KeyError:
            return False
    return True


def hand_over(user: pwd.struct_passwd | None, efs: Path, tmp: Path, env: dict[str, str]
              ) -> dict:
    """Make ``user``'s directories on EFS (it is no login user: the executors do not), give
    it the gate job's private directory ``tmp`` (the membership it runs on) and its login
    variables in ``env``; returns ``subprocess.Popen``'s identity arguments ({} for None:
    stay root)."""
    if user is None:
        return {}
    user_dirs.ensure(efs, {user.pw_name: (user.pw_uid, user.pw_gid)})
    for path in (tmp, *tmp.iterdir()):
        os.chown(path, user.pw_uid, user.pw_gid)
    env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def collective_user(efs: Path) -> tuple[pwd.struct_passwd | None, str]:
    """(who runs the gate's all-reduce, why not the gate's user): the gate's system user,
    or None (root) and the reason where it cannot (:func:`usable`)."""
    import bootstrap_scripts

    user = lookup()
    package_parent = str(Path(bootstrap_scripts.__file__).resolve().parent.parent)
    why = usable(user, sys.executable, package_parent, efs)
    return (None, why) if why else (user, "")


def usable(user: pwd.struct_passwd | None, python: str, package_parent: str, efs: Path
           ) -> str:
    """Why ``user`` cannot run the gate's collective here ("" when it can): it must start
    ``python``, import the gate's modules and list EFS, as itself."""
    if user is None:
        return f"no user {NAME} on this node (the node installer makes it)"
    probe = "import os, sys, bootstrap_scripts.ops.allreduce; os.listdir(sys.argv[1])"
    try:
        res = subprocess.run([python, "-I", "-c", f"import sys; sys.path.insert(0, "
                              f"{package_parent!r}); {probe}", str(efs)],
                             cwd="/", env={"PATH": os.defpath, "HOME": HOME},
                             capture_output=True, text=True, timeout=60, check=False,
                             user=user.pw_uid, group=user.pw_gid, extra_groups=[])
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{user.pw_name} cannot start {python}: {exc}"
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        return f"{user.pw_name} cannot run the gate: {lines[-1] if lines else res.returncode}"
    return ""

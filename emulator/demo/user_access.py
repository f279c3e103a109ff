"""Can a cluster user run a job here? ``dlc submit --as USER`` runs the user's ranks with
this checkout's Python on the emulated nodes, so every user must be able to reach the
interpreter and the checkout. On a real node both are the image's, open to every user; on a
laptop the project's Python often lives under a directory other users cannot enter (a pyenv
under /root), and the submitted job then fails with ``Permission denied`` and no hint. The
demo asks a real unprivileged user (``nobody``) before it prints the README's commands, and
names the directories and the fix when the answer is no.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

from emulator.deploy import REPO_ROOT
from emulator.node_inputs import PYTHON

#: The unprivileged user the check runs as (every Linux system has it).
PROBE_USER = "nobody"


def closed_directories(paths: list[str]) -> list[str]:
    """The directories above ``paths`` (and the links' targets) that other users cannot
    enter (no ``o+x``), in order, once each."""
    out: list[str] = []
    for path in paths:
        for target in (path, os.path.realpath(path)):
            for d in reversed(Path(target).parents):
                try:
                    mode = os.stat(d).st_mode
                except OSError:
                    continue
                if not mode & stat.S_IXOTH and str(d) not in out:
                    out.append(str(d))
    return out


def problem(python: str = PYTHON, repo: Path = REPO_ROOT) -> str:
    """"" when an unprivileged user can import this checkout with its Python; else what a
    cluster user's job will hit, and the fix. "" as well where the check cannot be made
    (not root, or no ``nobody``): the submitting user is then who runs it."""
    if os.geteuid() != 0:
        return ""
    try:
        probe = pwd.getpwnam(PROBE_USER)
    except KeyError:
        return ""
    try:
        res = subprocess.run([python, "-c", "import bootstrap_scripts"], cwd="/",
                             env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
                             user=probe.pw_uid, group=probe.pw_gid, extra_groups=[],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        error = str(exc)
    else:
        if res.returncode == 0:
            return ""
        error = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
    closed = closed_directories([python, str(repo)])
    fix = (f"chmod o+x {' '.join(closed)}" if closed else
           "make the interpreter and the checkout readable by every user")
    return (f"cluster users cannot run this project's Python ({python}, checkout {repo}): "
            f"as {PROBE_USER}: {error}. `dlc submit --as USER` would fail the same way. "
            f"On a real node the interpreter is the image's, open to every user; here, "
            f"either {fix}, or run `make setup` again with a python3 outside those "
            f"directories first on PATH (rm -rf .venv first).")

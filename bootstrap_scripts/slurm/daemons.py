"""munged, slurmctld and slurmd started from the node's own files: the Slurm units' ExecStart.

``python -m bootstrap_scripts.slurm.daemons DAEMON --root R --efs E [...]`` waits until what the
daemon needs is there (the munge key the agent writes at boot; slurm.conf, written when the
agent applies its first membership; munged's socket), makes the daemon's own directories
under the node's root, and then becomes the daemon (``exec``), in the foreground so systemd
supervises it. A wait that runs out exits 1 and systemd's ``Restart=`` starts it again.

- **munged** runs as ``munge`` (this process drops to it before ``exec``), with its socket,
  key, log, pid and seed files under the node's root;
- **slurmctld** (the master) starts as root and drops to ``SlurmUser`` itself; its
  ``StateSaveLocation`` is on EFS (``cluster/slurm/state``, SlurmUser's, 0700, in a root-owned
  parent) so a replacement master's slurmctld takes the queue over;
- **slurmd** (every node that trains) is a dynamic node (``-Z``) under its explicit name
  (``-N``, :mod:`.names`), with its features and GRES (``--conf``).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import config, munge_key, names

DAEMONS = ("munged", "slurmctld", "slurmd")
#: Seconds a daemon waits for its inputs before it exits for systemd to start it again.
DEFAULT_WAIT_SECONDS = 600.0
POLL_SECONDS = 0.25


class DaemonError(RuntimeError):
    """What a daemon needs is missing; the message says what."""


def binary(name: str) -> str:
    """The daemon's program: on PATH, else Debian's and AL2023's ``/usr/sbin``."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin") \
        or f"/usr/sbin/{name}"


def munged_argv(p: SlurmPaths) -> list[str]:
    return [binary("munged"), "--foreground", f"--socket={p.munge_socket}",
            f"--key-file={p.munge_key}", f"--log-file={p.munge_log}",
            f"--pid-file={p.munge_pid}", f"--seed-file={p.munge_seed}"]


def slurmctld_argv(p: SlurmPaths) -> list[str]:
    return [binary("slurmctld"), "-D", "-f", str(p.slurm_conf)]


def slurmd_argv(p: SlurmPaths, name: str, node_conf: str) -> list[str]:
    return [binary("slurmd"), "-D", "-Z", "-N", name, "-f", str(p.slurm_conf),
            "--conf", node_conf]


def wait_for(paths: Sequence[Path], seconds: float) -> None:
    """Until every one of ``paths`` exists; DaemonError naming the missing ones after
    ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        missing = [str(p) for p in paths if not p.exists()]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise DaemonError(f"still missing after {seconds:g} s: {', '.join(missing)}")
        time.sleep(POLL_SECONDS)


def _real_dir(path: Path) -> None:
    """Refuse a link or non-directory in ``path``'s place: root chowns and chmods it, and a
    link (EFS is writable by every worker's root) would hand that to its target."""
    if path.is_symlink() or not path.is_dir():
        raise DaemonError(f"{path} is not a directory of its own (a link or a file is in its "
                          f"place): refusing to hand it over")


def own_dir(path: Path, user: str, mode: int) -> None:
    """``path`` made (with root-owned parents) and handed to ``user`` with ``mode``."""
    path.mkdir(parents=True, exist_ok=True)
    _real_dir(path)
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    path.chmod(mode)


def prepare_munged(p: SlurmPaths) -> None:
    for d, mode in ((p.munge_run_dir, 0o755), (p.munge_log.parent, 0o700),
                    (p.munge_seed.parent, 0o700)):
        own_dir(d, munge_key.MUNGE_USER, mode)


def prepare_slurmctld(p: SlurmPaths) -> None:
    own_dir(p.run_dir, config.SLURM_USER, 0o755)
    own_dir(p.log_dir, config.SLURM_USER, 0o755)
    p.efs_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    _real_dir(p.efs_dir)
    os.chown(p.efs_dir, 0, 0, follow_symlinks=False)
    p.efs_dir.chmod(0o755)
    own_dir(p.state_dir, config.SLURM_USER, 0o700)


def prepare_slurmd(p: SlurmPaths, name: str) -> None:
    del name  # one slurmd per node: its spool is the node's own
    for d in (p.run_dir, p.log_dir, p.spool_dir):
        own_dir(d, "root", 0o755)


def become(user: str) -> None:
    """Drop this process to ``user`` (no supplementary groups) before ``exec``."""
    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dl-slurm-daemon", description=__doc__.split("\n")[0])
    ap.add_argument("daemon", choices=DAEMONS)
    ap.add_argument("--root", default="/")
    ap.add_argument("--efs", default="/efs", help="the EFS mount point (slurmctld's state)")
    ap.add_argument("--name", default="", help="slurmd: the node's Slurm name")
    ap.add_argument("--node-conf", default="", help="slurmd: its --conf (features, GRES)")
    ap.add_argument("--wait", type=float, default=DEFAULT_WAIT_SECONDS)
    return ap


def plan(ns: argparse.Namespace) -> tuple[list[Path], list[str]]:
    """What the daemon waits for and the argv it becomes (pure)."""
    p = SlurmPaths(ns.root, ns.efs)
    if ns.daemon == "munged":
        return [p.munge_key], munged_argv(p)
    if ns.daemon == "slurmctld":
        return [p.slurm_conf, p.munge_socket], slurmctld_argv(p)
    if names.address_of(ns.name) is None:
        raise DaemonError(f"slurmd needs --name ip-a-b-c-d, got {ns.name!r}")
    return [p.slurm_conf, p.munge_socket], slurmd_argv(p, ns.name, ns.node_conf)


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    p = SlurmPaths(ns.root, ns.efs)
    try:
        needs, exec_argv = plan(ns)
        wait_for(needs, ns.wait)
        if ns.daemon == "munged":
            prepare_munged(p)
            become(munge_key.MUNGE_USER)
        elif ns.daemon == "slurmctld":
            prepare_slurmctld(p)
        else:
            prepare_slurmd(p, ns.name)
    except (DaemonError, KeyError, OSError) as exc:
        print(f"dl-slurm-daemon {ns.daemon}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    os.execv(exec_argv[0], exec_argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())

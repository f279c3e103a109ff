"""Slurm's daemons on an emulated node, started as systemd would start the installer's units.

On EC2 a node's munged, slurmctld and slurmd are the installer's units (``dl-munged``,
``dl-slurmctld`` on the master, ``dl-slurmd``), run by systemd on a machine of their own.
The emulated nodes are processes of one host, so three things of a machine are played here,
and nothing in the product changes for them:

- **the node's own network stack**: each daemon runs with ``node_bind.c`` preloaded
  (``emulator.node_network``): slurmd's and slurmctld's wildcard listeners bind the node's
  127.x address (so every node's slurmd takes port 6818, as on separate instances), and,
  with ``DEEPLEARNING_NODE_CONNECT=1``, their connections leave from it (slurmctld records a
  dynamic node's address from the connection its slurmd registers on; from one host the
  kernel would otherwise say 127.0.0.1 for every node);
- **the node's host name**: each daemon runs in a UTS namespace of its own whose host name
  is the node's EC2 host name (``ip-a-b-c-d``): slurmctld starts only on the host its
  ``SlurmctldHost`` names, as it would on the master instance;
- **the VPC's DNS**: EC2 resolves every instance's host name (``ip-a-b-c-d``) to its address,
  and jobs rely on it (``scontrol show hostnames`` gives names: a torchrun rendezvous
  endpoint, gloo's own address). Each daemon runs in a mount namespace whose ``/etc/hosts``
  is the cluster's hosts file (:func:`vpc_hosts`: the host's own lines, then one line per
  node booted, appended in place so every namespace sees it grow); the tasks slurmstepd
  starts inherit it;
- **the GPUs' device files**: a node's GRES names ``<root>/dev/nvidia<N>``; here they are
  character devices with /dev/null's numbers (:func:`gpu_devices`), never a GPU.

Every daemon of a node's Slurm carries ``DL_SHARE_TOKEN=slurm/<address>``, and what they
start stays in their UTS namespaces, so :func:`stop` finds slurmstepd and the job's tasks
too (slurmd starts slurmstepd in a session of its own, with an environment of its own) and
a lost machine loses all of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

from bootstrap_scripts.node.procgroup import alive, descendants, pids_with_token
from bootstrap_scripts.slurm import names
from emulator.node_network import bind_preload
from emulator.units import NodeError, unit_exec, unit_output

UNIT_DIR = "etc/systemd/system"

#: The installer's Slurm units, and the daemon each runs.
UNITS = {"dl-munged.service": "munged", "dl-slurmctld.service": "slurmctld",
         "dl-slurmd.service": "slurmd"}
TOKEN_ENV = "DL_SHARE_TOKEN"


def token(address: str) -> str:
    return f"slurm/{address}"


def daemon_env(address: str, preload: Path) -> dict[str, str]:
    """What a node's Slurm daemons run with here (added to the unit's environment)."""
    return {"LD_PRELOAD": str(preload), "DEEPLEARNING_NODE_ADDR": address,
            "DEEPLEARNING_NODE_CONNECT": "1", TOKEN_ENV: token(address)}


#: The cluster's hosts file (next to the nodes' logs), and the host's own it starts from.
VPC_HOSTS = "vpc-dns.hosts"
HOST_HOSTS = Path("/etc/hosts")


def vpc_hosts(logs: Path, address: str) -> Path:
    """The cluster's hosts file with the node at ``address`` in it (added once; appended in
    place under a lock: nodes boot in parallel, and a renamed file would leave the running
    namespaces on the old one)."""
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / VPC_HOSTS
    line = f"{address} {names.node_name(address)}\n"
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        if not text:
            f.write(HOST_HOSTS.read_text().rstrip("\n") + "\n")
        if line not in text:
            f.write(line)
    path.chmod(0o644)
    return path


def user_env(preload: Path) -> dict[str, str]:
    """What a user's shell on an emulated node adds for Slurm jobs (``emulator.demo.shell``):
    the preload, which in a task's namespace (host name ``ip-a-b-c-d``) keeps its wildcard
    binds on its node and its connections leaving from it, as on an instance (srun inside a
    batch script listens there for its steps' output; slurmd answers the address a request
    came from). In the shell itself (this host's name) it changes nothing."""
    return {"LD_PRELOAD": str(preload), "DEEPLEARNING_NODE_CONNECT": "1"}


def with_host_name(address: str, argv: list[str], hosts: Path | None = None) -> list[str]:
    """``argv`` in a UTS namespace whose host name is the node's EC2 host name, and with
    ``hosts`` in a mount namespace of its own whose ``/etc/hosts`` it is."""
    if hosts is None:
        return ["unshare", "--uts", "--", "/bin/sh", "-c", 'hostname "$0" && exec "$@"',
                names.node_name(address), *argv]
    return ["unshare", "--uts", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
            'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"',
            names.node_name(address), str(hosts), *argv]


def gpu_devices(root: Path, gpus: int) -> list[Path]:
    """``<root>/dev/nvidia0..N-1`` as character devices (/dev/null's numbers), which the
    node's gres.conf names: Slurm takes only device files as GPUs."""
    dev = root / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    made = []
    for i in range(gpus):
        path = dev / f"nvidia{i}"
        if not path.exists():
            os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
        made.append(path)
    return made


def start(address: str, argv: list[str], env: dict[str, str], preload: Path, log: Path,
          *, cwd: Path, hosts: Path | None = None) -> subprocess.Popen:
    """One daemon of the node at ``address`` (the unit's ``ExecStart`` as ``argv``), in a
    process group of its own, its output appended to ``log``. munged talks on its socket
    only and runs as ``munge``: it gets the host name, not the preload."""
    log.parent.mkdir(parents=True, exist_ok=True)
    extra = daemon_env(address, preload)
    if "munged" in argv:
        extra = {k: v for k, v in extra.items() if k == TOKEN_ENV}
    with open(log, "ab") as out:
        return subprocess.Popen(with_host_name(address, argv, hosts), cwd=cwd,
                                env={**env, **extra},
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                process_group=0)


def installed_units(root: Path) -> list[str]:
    """The Slurm units the installer wrote on this node, in the order systemd starts them."""
    return [u for u in UNITS if (root / UNIT_DIR / u).exists()]


#: slurmstepd's longest socket below a node's root: ``var/spool/slurmd/<name>_<job>.<step>``
#: (an 18-character name, 10-digit ids); a Unix socket's path has 107 bytes at most.
SOCKET_TAIL = len("/var/spool/slurmd/") + 18 + 1 + 10 + 1 + 10
MAX_SOCKET_PATH = 107


def check_node_root(root: Path) -> None:
    """An emulated node's root must be short (slurmstepd's sockets live under it; an
    instance's root is ``/``) and sit in a tree everyone may traverse (munged refuses a
    socket with a parent that is not; an instance's ``/`` is 0755)."""
    if len(str(root)) + SOCKET_TAIL > MAX_SOCKET_PATH:
        raise NodeError(f"{root}: too long a node root for Slurm ({len(str(root))} characters,"
                        f" at most {MAX_SOCKET_PATH - SOCKET_TAIL}): slurmstepd's sockets "
                        f"under it would exceed a Unix socket's path")
    for d in [root, *root.parents]:
        if os.stat(d).st_mode & 0o011 != 0o011:
            raise NodeError(f"{d} is not traversable by all (mode {os.stat(d).st_mode & 0o777:o}):"
                            f" munged would refuse {root}'s socket; boot Slurm nodes under a "
                            f"directory every user can traverse")


def start_unit(root: Path, unit: str, address: str, env: dict[str, str], logs: Path
               ) -> subprocess.Popen:
    """What systemd starts for ``unit`` on the node at ``address`` under ``root``."""
    text = (root / UNIT_DIR / unit).read_text()
    argv, unit_env = unit_exec(text, unit)
    preload = bind_preload(logs / "lib")
    out = unit_output(text) or str(logs / f"{address}-{unit.removesuffix('.service')}.log")
    return start(address, argv, {**env, **unit_env}, preload, Path(out), cwd=root,
                 hosts=vpc_hosts(logs, address))


def _uts(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return ""


def namespaces(address: str) -> set[str]:
    """The UTS namespaces of the node's Slurm daemons (each daemon has its own)."""
    return {_uts(p) for p in pids_with_token(token(address))} - {"", _uts("self")}


def in_namespaces(spaces: set[str]) -> set[int]:
    """Every process in one of the UTS namespaces ``spaces``."""
    if not spaces:
        return set()
    return {int(e) for e in os.listdir("/proc") if e.isdigit() and _uts(e) in spaces}


def processes(address: str, spaces: set[str] | None = None) -> set[int]:
    """Every process of the node's Slurm: the daemons (their token), and everything in their
    UTS namespaces (``spaces``, learnt while a daemon lives), the node's "machine":
    slurmstepd (slurmd starts it with an environment of its own, in a session of its own)
    and the job tasks it starts."""
    tagged = set(pids_with_token(token(address)))
    found = tagged | in_namespaces((spaces or set()) | namespaces(address))
    return found | descendants(found)


def stop(address: str, *, sig: int = signal.SIGTERM, grace: float = 10.0) -> set[int]:
    """Stop the node's Slurm (``sig`` first, SIGKILL after ``grace``); the survivors. The
    namespaces are learnt first: slurmstepd outlives a slurmd that took the signal."""
    spaces = namespaces(address)
    for s, wait in ((sig, grace), (signal.SIGKILL, 5.0)):
        pids = processes(address, spaces)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, s)
        deadline = time.monotonic() + wait
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
            for pid in pids:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
    return {p for p in processes(address, spaces) if alive(p)}

"""What a node's jobs listen on, read from its kernel (``/proc``): the listening TCP sockets,
the processes that hold them, and which of those are a job's (a share's token, or a Slurm
task's ``SLURM_JOB_UID``). Root reads every process's ``fd`` and ``environ``; nothing here
follows a path a user chose. ``listen_guard`` keeps other users away from what it finds.

:func:`parse_proc_net` and :func:`reachable_as` are pure (unit-tested); the rest read
``/proc`` (tested on a made ``/proc`` tree and in the drill on the real one).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.protocol.records import Listening

#: the TCP state of a listening socket in ``/proc/net/tcp``
LISTEN_STATE = "0A"


@dataclass(frozen=True)
class Socket:
    """A listening socket as ``/proc/net/tcp{,6}`` shows it."""

    host: str
    port: int
    uid: int
    inode: int


def _hex_address(text: str) -> str:
    """``0100007F`` -> ``127.0.0.1``; 32 hex digits -> an IPv6 address (each 32-bit word in
    the kernel's byte order, little-endian on every machine the product runs on)."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def parse_proc_net(text: str) -> list[Socket]:
    """The listening sockets of a ``/proc/net/tcp`` or ``tcp6`` text. Lines of another shape
    are skipped. Pure."""
    found = []
    for line in text.splitlines()[1:]:
        words = line.split()
        if len(words) < 10 or words[3] != LISTEN_STATE or ":" not in words[1]:
            continue
        host, _, port = words[1].rpartition(":")
        try:
            found.append(Socket(_hex_address(host), int(port, 16), int(words[7]),
                                int(words[9])))
        except ValueError:
            continue
    return found


def reachable_as(host: str, node_address: str) -> list[str]:
    """The destination addresses a connection to a socket bound to ``host`` on a node at
    ``node_address`` can use: a wildcard is the node's address and its loopback; an IPv4
    address mapped into IPv6 is that IPv4 address. Pure."""
    ip = ipaddress.ip_address(host)
    if ip.is_unspecified:
        extra = ["::1"] if ip.version == 6 else []
        return [node_address, "127.0.0.1", *extra]
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return [str(ip.ipv4_mapped)]
    return [str(ip)]


def listening_sockets(proc: Path) -> list[Socket]:
    found: list[Socket] = []
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            found += parse_proc_net((proc / "net" / name).read_text())
    return found


def socket_inodes(pid_dir: Path) -> set[int]:
    """The inodes of the sockets a process holds (root reads any process's ``fd``)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.scandir(pid_dir / "fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(fd.path)
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
    return inodes


#: Slurm's daemons run as root and connect to a job's own listeners: slurmstepd reports each
#: task's exit to ``srun`` and forwards its output there; they speak Slurm's protocol,
#: authenticated by munge, and unpickle nothing a task sends
SLURM_DAEMONS_UID = 0


def guarded_for(pid_dir: Path, tokens: Mapping[str, int]) -> tuple[int, tuple[int, ...]] | None:
    """(the job's uid, the uids that may connect) for this process's sockets: a share's
    (it carries one of ``tokens``): its user alone; a task of a Slurm job (slurmstepd gives
    every task ``SLURM_JOB_ID`` and ``SLURM_JOB_UID``): its job's user and Slurm's daemons
    (:data:`SLURM_DAEMONS_UID`). None: neither. A process that sets these variables itself
    only has its own user's sockets guarded, for that user (and root)."""
    try:
        data = b"\0" + (pid_dir / "environ").read_bytes() + b"\0"
    except OSError:
        return None
    for token, uid in tokens.items():
        if b"\0DL_SHARE_TOKEN=" + token.encode() + b"\0" in data:
            return uid, (uid,)
    if b"\0SLURM_JOB_ID=" in data:
        match = re.search(rb"\0SLURM_JOB_UID=([0-9]{1,10})\0", data)
        if match is not None:
            uid = int(match[1])
            return uid, tuple(sorted({uid, SLURM_DAEMONS_UID}))
    return None


def candidate_sockets(proc: Path, tokens: Mapping[str, int]) -> dict[int, Socket]:
    """Listening sockets that may be a job's, by inode: a share's user's, or any user's but
    root's (a Slurm job's task is its user's)."""
    uids = set(tokens.values())
    return {s.inode: s for s in listening_sockets(proc) if s.uid in uids or s.uid != 0}


def job_listeners(proc: Path, tokens: Mapping[str, int], node_address: str,
                  candidates: Mapping[int, Socket] | None = None) -> frozenset[Listening]:
    """The endpoints of the listening sockets held by a process of a running share (or of
    a Slurm job) and owned by that share's (job's) user. ``tokens``: share token -> the
    share's uid; ``candidates``: :func:`candidate_sockets`, when already read."""
    if candidates is None:
        candidates = candidate_sockets(proc, tokens)
    found: set[Listening] = set()
    if not candidates:
        return frozenset()
    owners = {s.uid for s in candidates.values()}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid not in owners:
                continue
        except OSError:
            continue
        held = socket_inodes(Path(entry.path)) & candidates.keys()
        guard = guarded_for(Path(entry.path), tokens) if held else None
        for inode in held if guard is not None else ():
            s = candidates[inode]
            if s.uid == guard[0]:
                found.update(Listening(host=h, port=s.port, uid=allowed)
                             for h in reachable_as(s.host, node_address)
                             for allowed in guard[1])
    return frozenset(found)

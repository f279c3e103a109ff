"""Listening sockets the root executor binds for a share before any of its processes starts.

A torchrun job's rendezvous store (``jobs/engine/rdzv_store.py``) listens on the master at
the job's ``--rdzv-port``, and every agent of the job, on every node, connects there. If the
store binds that port itself, as the job's user, any other user's process that listens
there first (a squatter) gets the job's agents instead: it sees the job's rendezvous and
can steer it. So the executor (root) binds the job's listener itself, on its own node's
address only and a port the protocol allows (:data:`~bootstrap_scripts.protocol.jobs.RDZV_PORTS`,
privileged: no user can take them first; or an unprivileged one), before the share starts,
and hands the listening descriptor to the store (``DL_LISTEN_FD``). A bind that fails fails
the share at once, naming who listens there (:func:`holders`): no process of the share
starts, and the job's other nodes wait for the master's share to have started cleanly
before they start theirs (:func:`waits_for_listener`), so no agent of the job meets
somebody else's store.

Why ``SO_REUSEADDR`` and not ``SO_REUSEPORT``: ``SO_REUSEADDR`` lets the bind succeed over
the previous job's connections still in ``TIME_WAIT`` (Linux never lets it share a port
with a socket that listens: tcp(7)); ``SO_REUSEPORT`` would let another socket of the same
uid listen on the port too, and is never set.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import pwd
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.protocol.jobs import RDZV_PORTS, UNPRIVILEGED_PORTS, JobSpec, Listener, Share

#: TCP_LISTEN in ``/proc/net/tcp``'s ``st`` column.
TCP_LISTEN = "0A"
#: How many connections may wait for the store to accept (torch's own server uses 2048
#: on Linux; the agents connect before the store's interpreter has even started).
BACKLOG = 2048


class ListenerRefused(Exception):
    """The share's listener is not allowed here, or the port is taken: the message says
    which address and port, and who holds it."""


@dataclass(frozen=True)
class Holder:
    """A socket listening on a port, from ``/proc/net/tcp{,6}``, and who holds it."""

    address: str
    port: int
    uid: int
    inode: int
    #: (pid, real uid) of the processes that have it open (root sees them all)
    processes: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        text = f"{self.address}:{self.port} is listened on by a socket of uid {who(self.uid)}"
        if self.processes:
            text += ", open in " + ", ".join(f"pid {pid} of uid {who(uid)}"
                                             for pid, uid in self.processes)
        return text


def who(uid: int) -> str:
    """``1001 (alice)``: a uid and, when it has one, its user name."""
    try:
        return f"{uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return str(uid)


def listener_of(share: Share) -> tuple[int, Listener] | None:
    """(process index, listener) of the share's process that needs one, if any."""
    found = [(i, p.listen) for i, p in enumerate(share.procs) if p.listen is not None]
    return found[0] if found else None


def listener_share(spec: JobSpec) -> Share | None:
    """The share of ``spec`` whose executor binds the job's listener (the master's)."""
    return next((s for s in spec.shares if listener_of(s) is not None), None)


def waits_for_listener(spec: JobSpec, share: Share) -> Share | None:
    """The share another share of the job must see started without error before it
    starts (None: it need not wait): its agents would otherwise connect to whatever
    listens at the rendezvous address before the job's own store does."""
    holder = listener_share(spec)
    return holder if holder is not None and holder.rank != share.rank else None


def check(listener: Listener, share: Share, node_address: str) -> None:
    """Root binds only its own node's address (the job's master: the spec's rank 0, checked
    when the spec was read) and an allowed port (checked by the protocol; again here)."""
    if listener.host != node_address or share.address != node_address:
        raise ListenerRefused(f"refusing to listen on {listener.host}:{listener.port}: this "
                              f"node's address is {node_address}")
    if not (listener.port in RDZV_PORTS or listener.port in UNPRIVILEGED_PORTS):
        raise ListenerRefused(f"refusing to listen on port {listener.port}: not in the "
                              f"rendezvous window {RDZV_PORTS[0]}-{RDZV_PORTS[-1]} nor "
                              f"unprivileged")


def bind_for(share: Share, node_address: str) -> dict[int, socket.socket]:
    """The listening socket of the share's process that asks for one, by process index
    ({} when none does), checked and bound. ListenerRefused when it cannot be."""
    found = listener_of(share)
    if found is None:
        return {}
    index, listener = found
    check(listener, share, node_address)
    return {index: bind(listener)}


def bind(listener: Listener, proc_root: Path = Path("/proc")) -> socket.socket:
    """A socket bound to the listener's address and listening (close it once handed on).
    ListenerRefused naming the holder when somebody else has the port."""
    sock = socket.socket(family(listener.host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((listener.host, listener.port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenerRefused(refusal(listener, exc, proc_root)) from None
    return sock


def family(host: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 address, else IPv4 (node addresses are IP addresses)."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


def refusal(listener: Listener, exc: OSError, proc_root: Path) -> str:
    """Why the job's listener could not be bound, with who holds the port."""
    text = (f"cannot listen on {listener.host}:{listener.port} for the job's rendezvous: "
            f"{exc.strerror or exc}")
    if exc.errno == errno.EADDRINUSE:
        found = holders(listener.host, listener.port, proc_root)
        text += ("; " + "; ".join(h.describe() for h in found)) if found else \
            "; no socket listens there (a connection or a socket bound without listening " \
            "holds it)"
        text += ": pick another --rdzv-port"
    elif exc.errno == errno.EACCES and os.geteuid() != 0:
        text += (f" (this job executor is not root; ports {RDZV_PORTS[0]}-{RDZV_PORTS[-1]} "
                 f"need root: pass --rdzv-port {UNPRIVILEGED_PORTS[0]} or above)")
    return text


def parse_address(hex_address: str) -> tuple[str, int]:
    """``0500007F:0126`` -> ('127.0.0.5', 294): ``/proc/net/tcp{,6}`` prints each 32-bit
    word of the address in host byte order, the port in hex."""
    addr_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(addr_hex)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw)), int(port_hex, 16)


def parse_proc_net_tcp(text: str) -> list[Holder]:
    """The listening sockets of one ``/proc/net/tcp`` or ``tcp6`` table."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        address, port = parse_address(fields[1])
        found.append(Holder(address, port, int(fields[7]), int(fields[9])))
    return found


def covers(listening: str, host: str) -> bool:
    """Whether a socket listening on ``listening`` takes connections meant for ``host``."""
    mapped = ipaddress.ip_address(listening)
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped is not None:
        mapped = mapped.ipv4_mapped
    return mapped.is_unspecified or mapped == ipaddress.ip_address(host)


def holders(host: str, port: int, proc_root: Path = Path("/proc")) -> list[Holder]:
    """Who listens on ``host:port`` (or on every address at that port): the socket's uid
    and the processes that have it open."""
    found: list[Holder] = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            found += [h for h in parse_proc_net_tcp((proc_root / "net" / table).read_text())
                      if h.port == port and covers(h.address, host)]
    if not found:
        return []
    owners = socket_owners({h.inode for h in found}, proc_root)
    return [Holder(h.address, h.port, h.uid, h.inode, tuple(owners.get(h.inode, ())))
            for h in found]


def socket_owners(inodes: set[int], proc_root: Path) -> dict[int, list[tuple[int, int]]]:
    """inode -> [(pid, real uid)] of the processes with that socket open (only on a
    refusal: a walk of every process's descriptors)."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    owners: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir(proc_root):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            links = {fd_link(fd.path) for fd in os.scandir(os.path.join(entry.path, "fd"))}
            for inode in {wanted[link] for link in links & wanted.keys()}:
                owners.setdefault(inode, []).append((int(entry.name), real_uid(entry.path)))
    return owners


def fd_link(path: str) -> str:
    """What a ``/proc/<pid>/fd`` entry points to ("" when it went meanwhile)."""
    try:
        return os.readlink(path)
    except OSError:
        return ""


def real_uid(proc_dir: str) -> int:
    for line in Path(proc_dir, "status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return -1

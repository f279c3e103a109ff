"""Only a job's own user reaches what the job listens on, on every node: an nftables table
per node, fed by what each node's root executor finds its jobs listening on.

A torchrun job listens on more than its rendezvous store (which ``store_guard`` guards): the
workers' own store (a TCPStore torch's agent opens on a free port of the rendezvous's rank
0 node, ``TORCHELASTIC_USE_AGENT_STORE``) and the collectives' sockets (gloo's and NCCL's, on
free ports of every node). None of them authenticates a client, ``/proc/net/tcp`` shows every
listening socket and its uid to every user, and ``all_gather_object`` /
``broadcast_object_list`` unpickle what they receive: whoever connects can steer the job or
run code as its user. The ports are chosen at run time, so no rule can be written before the
job starts; but every process of a job carries its share's token (``procgroup``), so the node
it runs on can tell which listening sockets are the job's.

So each root executor, twice a second:

1. finds the listening TCP sockets held by its shares' processes and by Slurm jobs' tasks
   (``listen_sockets``: ``/proc/net/tcp{,6}``, the socket inodes in each process's ``fd``,
   the share's token or slurmstepd's ``SLURM_JOB_UID`` in its environment) and owned by
   that share's (job's) user;
2. publishes those at its own address as ``cluster/listeners/<address>.<seq>.json`` when they
   change (root's records; the sequence number in the name tells readers which changed from
   one directory listing, so a reader's steady state costs one listing a second);
3. keeps a table ``inet dl_listen_guard_<address>`` whose sets hold every listed
   ``(address, port)`` of every member node and its ``(address, port, uid)``, with one rule
   in the OUTPUT hook: a TCP packet to a listed endpoint from any other uid is reset.

Connections leave through the sending node's OUTPUT hook, so the table on each node covers
that node's users, root included. The table is replaced whole in one ``nft -f`` transaction
when the wanted sets change, and a hash set keeps the per-packet cost flat however many
endpoints a large cluster lists. The emulated nodes share one kernel: each has its table, and
the emulator takes a gone machine's away (:func:`forget`), as a machine's kernel goes with it.

Limits (docs/security.md): a listener is open from its ``listen()`` until its node's next scan
(at most :data:`SCAN_SECONDS`, plus the time its record takes to reach the other nodes, one
listing a second); a connection made in that window is reset at its next packet, but what it
sent before is sent. Root on a worker can publish a wrong record, as it can write anything on
EFS; a record only names its own node's address, and nodes that are not members are ignored.

The pure parts (:func:`wanted`, :func:`nft_script`, the names) are unit-tested;
:class:`ListenGuard` runs them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from bootstrap_scripts.jobs.executor.listen_sockets import candidate_sockets, job_listeners
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.records import Listening, NodeListeners

LOG = logging.getLogger("dl-executor")

TABLE_PREFIX = "dl_listen_guard_"
#: how often a node looks at what its jobs listen on (the processes are walked only when its
#: listening sockets changed: an idle node reads ``/proc/net/tcp*`` and nothing else)
SCAN_SECONDS = 0.5
#: how often the other nodes' records are listed
READ_SECONDS = 1.0
#: a record names at most this many sockets (a node with 8 GPUs and a few jobs has dozens)
MAX_LISTENING = 4096
RECORD_LIMIT = 512 * 1024
NAME_RE = re.compile(r"^(?P<address>[0-9A-Fa-f.:]+)\.(?P<seq>[0-9]{1,20})\.json$")
#: where ``nft`` is looked for: the system's directories, whatever the executor's PATH says
SYSTEM_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"


class GuardError(RuntimeError):
    """The table could not be written; the message says why."""


def wanted(own: Iterable[Listening], others: Mapping[str, NodeListeners],
           members: Iterable[str]) -> frozenset[Listening]:
    """Every endpoint this node keeps other users from: its own shares' (any address, its
    loopback included) and, of each other member node's record, those at that node's own
    address (what a connection from here can reach; a record naming anything else is not
    believed). Pure."""
    keep = set(own)
    for address in set(members):
        rec = others.get(address)
        if rec is not None and rec.address == address:
            keep.update(x for x in rec.listening if x.host == address)
    return frozenset(keep)


def nft_tool() -> str | None:
    return shutil.which("nft", path=SYSTEM_PATH)


def table_name(node_address: str) -> str:
    return TABLE_PREFIX + re.sub(r"[^0-9A-Za-z]", "_", node_address)


def _elements(items: list[str]) -> str:
    return "{ " + ", ".join(items) + " }"


def nft_script(node_address: str, endpoints: Iterable[Listening]) -> str:
    """The ``nft -f`` transaction that makes this node's table hold ``endpoints`` (created
    first so that its deletion cannot fail; replaced whole). Pure."""
    name = table_name(node_address)
    four, six = [], []
    for x in sorted(set(endpoints), key=lambda e: (e.host, e.port, e.uid)):
        (six if ipaddress.ip_address(x.host).version == 6 else four).append(x)
    lines = [f"table inet {name}", f"delete table inet {name}", f"table inet {name} {{",
             "  set guarded4 { type ipv4_addr . inet_service; }",
             "  set owned4 { type ipv4_addr . inet_service . uid; }",
             "  set guarded6 { type ipv6_addr . inet_service; }",
             "  set owned6 { type ipv6_addr . inet_service . uid; }",
             "  chain output {",
             "    type filter hook output priority 0; policy accept;",
             "    ip daddr . tcp dport @guarded4 ip daddr . tcp dport . meta skuid != @owned4 "
             "reject with tcp reset",
             "    ip6 daddr . tcp dport @guarded6 ip6 daddr . tcp dport . meta skuid != @owned6 "
             "reject with tcp reset",
             "  }", "}"]
    for family, items in (("4", four), ("6", six)):
        if items:
            lines.append(f"add element inet {name} guarded{family} " + _elements(
                sorted({f"{x.host} . {x.port}" for x in items})))
            lines.append(f"add element inet {name} owned{family} " + _elements(
                [f"{x.host} . {x.port} . {x.uid}" for x in items]))
    return "\n".join(lines) + "\n"


# -- the records on EFS ------------------------------------------------------------------------

def parse_name(name: str) -> tuple[str, int] | None:
    """``<address>.<seq>.json`` -> (address, seq); None for any other name. Pure."""
    match = NAME_RE.match(name)
    if match is None:
        return None
    try:
        ipaddress.ip_address(match["address"])
    except ValueError:
        return None
    return match["address"], int(match["seq"])


def latest_names(names: Iterable[str]) -> dict[str, int]:
    """address -> the highest sequence number listed for it. Pure."""
    latest: dict[str, int] = {}
    for name in names:
        parsed = parse_name(name)
        if parsed is not None and parsed[1] >= latest.get(parsed[0], -1):
            latest[parsed[0]] = parsed[1]
    return latest


class ListenGuard:
    """This node's part: find and publish its shares' listeners, keep its table current."""

    def __init__(self, node: ThisNode, proc: Path = Path("/proc")) -> None:
        self.node = node
        self.cluster = node.cluster
        self.proc = proc
        self.own: frozenset[Listening] = frozenset()
        self.published: tuple[Listening, ...] | None = None
        self.seq = 0
        #: address -> (seq, record) of the other nodes' records as last read
        self.others: dict[str, tuple[int, NodeListeners]] = {}
        self.applied: frozenset[Listening] | None = None
        self.members: frozenset[str] = frozenset()
        self.scanned: tuple[frozenset, frozenset] | None = None
        self.scanned_at = self.read_at = 0.0
        self.warned = False

    @property
    def address(self) -> str:
        return self.node.address  # known once the node agent has said it

    def active(self) -> bool:
        """Only root can look into other users' processes and write the kernel's rules."""
        if os.geteuid() == 0:
            return True
        if not self.warned:
            LOG.warning("this job executor is not root: what jobs listen on is not guarded "
                        "(any local user can reach it)")
            self.warned = True
        return False

    def ready(self) -> None:
        """Before a share starts: GuardError when this root executor could not guard it (no
        ``nft``), so the share is refused rather than run open."""
        if self.active() and nft_tool() is None:
            raise GuardError("nft is not installed: cannot keep other users away from what "
                             "the job listens on (install nftables)")

    def tick(self, tokens: Mapping[str, int], now: float) -> None:
        """One look (called from the executor's loop): ``tokens`` maps each running share's
        token to its uid. Never raises."""
        if not self.address or not self.active():
            return
        try:
            if now - self.scanned_at >= SCAN_SECONDS:
                self.scanned_at = now
                self.scan(tokens)
            if now - self.read_at >= READ_SECONDS:
                self.read_at = now
                self.read_others()
                m = self.node.membership()  # the node's own copy, on its local disk
                self.members = frozenset(n.address for n in m.nodes) if m else frozenset()
            want = wanted(self.own, {a: r for a, (_s, r) in self.others.items()},
                          self.members - {self.address})
            if self.applied is None and not want:
                forget(self.address)  # a table a killed predecessor left: nothing to guard
                self.applied = frozenset()
            elif want != self.applied:
                self.apply(want)
        except (OSError, GuardError) as exc:
            LOG.error("guarding what jobs listen on: %s", exc)

    def scan(self, tokens: Mapping[str, int]) -> None:
        """Look again; the processes are walked only when the listening sockets (or the
        shares) changed since the last look, so an idle node reads ``/proc/net/tcp*`` only."""
        candidates = candidate_sockets(self.proc, tokens)
        key = (frozenset(candidates), frozenset(tokens.items()))
        if key != self.scanned:
            self.own = job_listeners(self.proc, tokens, self.address, candidates)
            self.scanned = key
        self.publish()

    def publish(self) -> None:
        mine = tuple(sorted((x for x in self.own if x.host == self.address),
                            key=lambda x: (x.port, x.uid)))[:MAX_LISTENING]
        if mine == self.published or (not mine and self.published is None):
            return  # nothing new (nothing at all yet: no record)
        if not self.cluster.cluster_dir.is_dir():
            return  # EFS is not there yet
        self.seq = max(self.seq + 1, time.time_ns() // 1000)
        self.cluster.listeners_dir.mkdir(mode=0o755, exist_ok=True)
        store.write_record(self.cluster.listeners(self.address, self.seq),
                           NodeListeners(address=self.address, seq=self.seq, listening=mine))
        self.published = mine
        self.remove_own(keep=self.seq)

    def remove_own(self, keep: int = -1) -> None:
        with contextlib.suppress(OSError):
            for name in os.listdir(self.cluster.listeners_dir):
                parsed = parse_name(name)
                if parsed is not None and parsed[0] == self.address and parsed[1] != keep:
                    with contextlib.suppress(OSError):
                        os.unlink(self.cluster.listeners_dir / name)

    def read_others(self) -> None:
        try:
            names = os.listdir(self.cluster.listeners_dir)
        except FileNotFoundError:
            names = []
        latest = latest_names(names)
        latest.pop(self.address, None)
        for address in set(self.others) - set(latest):
            del self.others[address]
        for address, seq in latest.items():
            if self.others.get(address, (None,))[0] == seq:
                continue
            path = self.cluster.listeners(address, seq)
            try:
                rec = store.read_record(path, NodeListeners, limit=RECORD_LIMIT)
            except (OSError, ProtocolError) as exc:
                LOG.warning("%s set aside: %s", path.name, exc)
                rec = None
            if rec is not None and rec.address == address:
                self.others[address] = (seq, rec)

    def apply(self, want: frozenset[Listening]) -> None:
        tool = nft_tool()
        if tool is None:
            raise GuardError("nft is not installed")
        res = _run([tool, "-f", "-"], nft_script(self.address, want))
        if res.returncode != 0:
            raise GuardError(f"nft -f for table {table_name(self.address)} failed: "
                             f"{(res.stderr or res.stdout).strip()[:500]}")
        if want != self.applied:
            LOG.info("guarding %d endpoints jobs listen on (%d of this node's)", len(want),
                     len(self.own))
        self.applied = want

    def release_all(self) -> None:
        """The executor stops: its record and its table go (a restarted one makes them
        again from what runs)."""
        if not self.address or os.geteuid() != 0:
            return
        self.remove_own()
        with contextlib.suppress(GuardError):
            forget(self.address)
        self.applied = self.published = self.scanned = None
        self.own = frozenset()


def forget(node_address: str) -> bool:
    """Delete ``node_address``'s table (its executor stopped, or, on the emulator, its
    machine went). False when this process cannot (not root, no ``nft``) or ``nft`` refused;
    GuardError when ``nft`` cannot run."""
    tool = nft_tool()
    if tool is None or os.geteuid() != 0:
        return False
    name = table_name(node_address)
    res = _run([tool, "-f", "-"], f"table inet {name}\ndelete table inet {name}\n")
    return res.returncode == 0


def _run(argv: list[str], stdin: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GuardError(f"{argv[0]}: {exc}") from None

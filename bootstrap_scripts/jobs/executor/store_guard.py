"""Only the job's own user reaches a job's rendezvous store: a netfilter owner match per job.

A torchrun job's store (``jobs/engine/rdzv_store.py``) is a TCPStore: it serves any client
that connects, and torch's dynamic rendezvous unpickles the value under
``torch.rendezvous.<id>`` at every sync of every agent (its monitor loop does it ten times
a second). The endpoint and the id are in every agent's argv, which ``/proc/*/cmdline``
shows to every user. So anyone who can connect can run code as the job's user in the job
(and, through the same store, steer everything else it holds: ``MASTER_ADDR`` /
``MASTER_PORT``, the workers' keys). TCPStore has no authentication, and signing only the
rendezvous value would leave every other key open; what closes the whole store is that no
one but the job's processes can reach it.

Every process of a job runs as its user, on the nodes of the job, and every connection a
node makes leaves through that node's own OUTPUT chain. So each node's root executor
inserts, before the job's share starts (and on a node with no share, as soon as it has
read the spec), one rule::

    iptables -I OUTPUT 1 -d <store host>/32 -p tcp --dport <store port>
             -m owner ! --uid-owner <job's uid> -m comment --comment dl-store-guard:<node>:<job>
             -j REJECT --reject-with tcp-reset

Every other uid, root included (no root process can be fed a pickle either), gets a reset.
The same rule is what guards IMDS (``agent/imds_guard.py``). It goes when the node's share
ends (or, on a node without a share, when the job is done). A rule left behind by an
executor that died is replaced when the next job uses that endpoint: the endpoint belongs
to one job at a time (root binds it, ``listeners.py``), so a guard of another job for the
same host and port is stale and removed. An executor that is not root (a one-user
development setup) cannot install rules and guards nothing; a root executor that cannot
install the rule refuses the share (fail closed).

:func:`rule` builds the exact arguments (pure, unit-tested); :class:`StoreGuards` runs them.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.executor import listeners
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.paths import JobPaths

LOG = logging.getLogger("dl-executor")

#: The comment that marks the product's rules: ``dl-store-guard:<node address>:<job key>``.
COMMENT = "dl-store-guard"
#: netfilter keeps at most 255 characters of a comment.
COMMENT_MAX = 255
#: How often the guards of finished jobs are looked for (each look opens two markers).
TICK_SECONDS = 1.0


class GuardError(RuntimeError):
    """The rule could not be installed; the message says which command failed and why."""


@dataclass(frozen=True)
class Endpoint:
    """Where a job's store listens (the master's address, the ``--rdzv-port``)."""

    host: str
    port: int


def endpoint(spec: JobSpec) -> Endpoint | None:
    """The store endpoint of ``spec`` (None: the job has no listener to guard)."""
    share = listeners.listener_share(spec)
    found = listeners.listener_of(share) if share is not None else None
    return Endpoint(found[1].host, found[1].port) if found is not None else None


def comment(node: str, key: str) -> str:
    return f"{COMMENT}:{node}:{key}"[:COMMENT_MAX]


def rule(at: Endpoint, uid: int, tag: str) -> list[str]:
    """The OUTPUT chain rule (after ``-C``/``-I``/``-D OUTPUT``): any uid but the job's
    connecting to its store is reset."""
    return ["-d", f"{at.host}/32", "-p", "tcp", "--dport", str(at.port),
            "-m", "owner", "!", "--uid-owner", str(uid),
            "-m", "comment", "--comment", tag, "-j", "REJECT", "--reject-with", "tcp-reset"]


def listed_guards(listing: str) -> list[list[str]]:
    """The product's store guards in ``iptables -S OUTPUT`` output, each as the words after
    ``-A OUTPUT`` (what ``-D OUTPUT`` takes back). Pure."""
    found = []
    for line in listing.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if words[:2] != ["-A", "OUTPUT"] or "--comment" not in words:
            continue
        tag = words[words.index("--comment") + 1] if words[-1] != "--comment" else ""
        if tag.startswith(COMMENT + ":"):
            found.append(words[2:])
    return found


def word_after(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1] if flag in words[:-1] else ""


def guards_endpoint(words: list[str], at: Endpoint) -> bool:
    return word_after(words, "-d") == f"{at.host}/32" and \
        word_after(words, "--dport") == str(at.port)


class StoreGuards:
    """The store guards this node's executor installed, by job key."""

    def __init__(self, node: ThisNode) -> None:
        self.node = node
        #: job key -> (endpoint, uid, the job's paths) of the rules this executor keeps
        self.held: dict[str, tuple[Endpoint, int, JobPaths]] = {}
        self.warned = False
        self.ticked_at = 0.0

    def iptables(self) -> str | None:
        """The ``iptables`` to run (None: this executor is not root and guards nothing)."""
        if os.geteuid() != 0:
            if not self.warned:
                LOG.warning("this job executor is not root: jobs' rendezvous stores are not "
                            "guarded (any local user can reach them)")
                self.warned = True
            return None
        found = shutil.which("iptables")
        if found is None:
            raise GuardError("iptables is not installed: cannot keep other users away from "
                             "the job's rendezvous store (install iptables)")
        return found

    def guard(self, spec: JobSpec, paths: JobPaths, uid: int) -> str:
        """Keep every uid but ``uid`` (the job's; -1: this executor's) away from the job's
        store; returns what was done ("" when there is nothing to guard). GuardError when a
        root executor cannot."""
        at = endpoint(spec)
        if at is None:
            return ""
        owner = os.geteuid() if uid < 0 else uid
        if self.held.get(paths.key, (None, None))[:2] == (at, owner):
            return f"{at.host}:{at.port} already guarded for uid {owner}"
        tool = self.iptables()
        if tool is None:
            return ""
        key = paths.key
        tag = comment(self.node.address, key)
        for words in listed_guards(run([tool, "-w", "-S", "OUTPUT"]).stdout):
            if guards_endpoint(words, at) and not word_after(words, "--comment").endswith(
                    ":" + key):
                run([tool, "-w", "-D", "OUTPUT", *words])  # another job's, left behind
        self.held[key] = (at, owner, paths)
        spec_words = rule(at, owner, tag)
        if run([tool, "-w", "-C", "OUTPUT", *spec_words]).returncode == 0:
            return f"{at.host}:{at.port} already guarded for uid {owner}"
        res = run([tool, "-w", "-I", "OUTPUT", "1", *spec_words])
        if res.returncode != 0:
            self.held.pop(key, None)
            raise GuardError(f"iptables -I OUTPUT for the store {at.host}:{at.port} failed: "
                             f"{(res.stderr or res.stdout).strip()}")
        LOG.info("job %s: its rendezvous store %s:%d reachable by uid %d only", key, at.host,
                 at.port, owner)
        return f"{at.host}:{at.port} guarded for uid {owner}"

    def tick(self, running: set[str], now: float) -> None:
        """Release the guards of the jobs that are over (looked at once a second): no share
        of it running here (``running``: job keys) and done (its runner finished),
        cancelled or gone (its directory archived)."""
        if now - self.ticked_at < TICK_SECONDS:
            return
        self.ticked_at = now
        for key, (_at, _uid, paths) in list(self.held.items()):
            if key not in running and (not paths.dir.is_dir() or userfiles.exists(paths.done)
                                       or userfiles.exists(paths.cancel)):
                self.release(key)

    def release_all(self) -> None:
        """The executor stops (its shares stopped): it can no longer tell when the jobs end,
        so its guards go; a restarted executor guards the live jobs again as it reads their
        specs."""
        for key in list(self.held):
            self.release(key)

    def release(self, key: str) -> None:
        """Take this node's guard of ``key`` away (the job is over). Never raises: a guard
        that stays behind only keeps others from a port nobody serves, and the next job
        there replaces it."""
        held = self.held.pop(key, None)
        tool = shutil.which("iptables")
        if held is None or os.geteuid() != 0 or tool is None:
            return
        words = rule(held[0], held[1], comment(self.node.address, key))
        try:
            while run([tool, "-w", "-C", "OUTPUT", *words]).returncode == 0:
                if run([tool, "-w", "-D", "OUTPUT", *words]).returncode != 0:
                    raise GuardError("iptables -D OUTPUT failed")
        except GuardError as exc:
            LOG.error("job %s: cannot remove the guard of its store %s:%d: %s", key,
                      held[0].host, held[0].port, exc)


def forget(node_address: str) -> int:
    """Take away every store guard the executor of ``node_address`` installed; returns how
    many (a machine that goes away takes its kernel's rules along; the emulator, whose nodes
    share one kernel, calls this when an emulated machine goes, killed ones included).
    GuardError when ``iptables`` cannot be run."""
    tool = shutil.which("iptables")
    if tool is None or os.geteuid() != 0:
        return 0
    mine = comment(node_address, "")
    gone = 0
    for words in listed_guards(run([tool, "-w", "-S", "OUTPUT"]).stdout):
        if word_after(words, "--comment").startswith(mine):
            gone += run([tool, "-w", "-D", "OUTPUT", *words]).returncode == 0
    return gone


def run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GuardError(f"{argv[0]}: {exc}") from None

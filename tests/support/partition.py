"""A network partition between emulated nodes: the kernel's netfilter drops their packets.

Emulated nodes are processes of one host, each on its own loopback address; a partition
between two of them is one ``iptables -I OUTPUT ... -s A -d B -j DROP`` rule per direction
(every loopback packet passes OUTPUT once, with the addresses it carries). A packet is
dropped, never refused: to both ends the peer goes silent, as across a broken link, and
TCP retransmits until it gives up or the link heals.

Only traffic that leaves from a node's own address is cut: a process that connects
without binding leaves from 127.0.0.1 (the kernel's choice for every loopback
destination). The drills give each node's executor ``DEEPLEARNING_NODE_CONNECT=1``
(``emulator/node_bind.c``, preloaded on every emulated node): the job's connections then
leave from its node's address, as an instance's leave from its private address.

Every rule carries the comment :data:`TAG` and is deleted by its exact words when the
partition heals, even when the drill failed (needs root, as ``make chaos`` runs).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator

TAG = "dl-chaos-partition"


def why_not() -> str:
    """'' when a partition can be made here, else why not."""
    tool = shutil.which("iptables")
    if tool is None:
        return "iptables is not installed (scripts/system-deps.sh iptables)"
    res = subprocess.run([tool, "-w", "-S", "OUTPUT"], capture_output=True, text=True,
                         timeout=30, check=False)
    return "" if res.returncode == 0 else f"iptables cannot read OUTPUT: {res.stderr.strip()}"


def rule(src: str, dst: str) -> list[str]:
    """The words of the rule that drops ``src`` -> ``dst``."""
    return ["-s", f"{src}/32", "-d", f"{dst}/32", "-m", "comment", "--comment", TAG,
            "-j", "DROP"]


class Partition:
    """The rules of one partition: :meth:`cut` adds them, :meth:`heal` deletes them."""

    def __init__(self, a: str, b: str, *, one_way: bool = False) -> None:
        self.pairs = [(a, b)] if one_way else [(a, b), (b, a)]
        self.added: list[list[str]] = []

    def cut(self) -> None:
        for src, dst in self.pairs:
            words = rule(src, dst)
            subprocess.run(["iptables", "-w", "-I", "OUTPUT", "1", *words], check=True,
                           capture_output=True, timeout=30)
            self.added.append(words)

    def heal(self) -> None:
        while self.added:
            words = self.added.pop()
            subprocess.run(["iptables", "-w", "-D", "OUTPUT", *words], check=False,
                           capture_output=True, timeout=30)

    @property
    def cut_now(self) -> bool:
        return bool(self.added)


@contextlib.contextmanager
def partitioned(a: str, b: str, *, one_way: bool = False) -> Iterator[Partition]:
    """``a`` and ``b`` cannot reach each other (``one_way``: ``a``'s packets to ``b`` are
    dropped, ``b``'s to ``a`` pass) until the block ends or :meth:`Partition.heal`."""
    p = Partition(a, b, one_way=one_way)
    try:
        p.cut()
        yield p
    finally:
        p.heal()

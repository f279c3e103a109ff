"""An elastic managed job growing back: a replacement joins the running attempt.

When the restart policy ran an elastic job's attempt on the survivors at once
(``restart_policy.World.SURVIVORS_NOW``) rather than waiting for Auto Scaling's
replacement, the attempt is published with ``join_admission``: a node that enters the
membership later does not join it by itself. While the attempt runs (every elastic
attempt: a node lost mid-attempt is tolerated by torchrun, so its replacement comes while
the attempt runs too), the supervisor looks at the live membership (:meth:`Rejoin.look`):
a node there that
the attempt does not run on, that the job did not exclude and whose executor is alive
(:func:`joiners`, pure) goes through the same health gate as before an attempt. Passing, it
is admitted (``jobs/<attempt>/admitted/<address>``, written as the job's user in the
user's attempt directory) and its executor joins the attempt through the existing elastic
path (``executor/elastic.py``): its torchrun agent enters the rendezvous, the running agents
see a node waiting and restart their workers with it (TorchElastic's membership change,
the job's next restart point), which resume from the latest checkpoint. Failing, it is
marked Unhealthy and excluded, as any node failing the gate.

The admission is a health decision, not a security boundary: the job's user could write it
too, and would only bring into their own job a node that is in the cluster's membership.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.engine.reachability import FRESH_WITHIN_SECONDS
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.job_paths import SHARE_STARTED_SUFFIX, JobPaths
from bootstrap_scripts.protocol.membership import Membership, Node
from bootstrap_scripts.protocol.records import ShareStarted

LOG = logging.getLogger("dl-controller")
#: How often the supervisor looks for a late node while an elastic attempt runs: within
#: the liveness rule's freshness window, so that a new executor is seen moving between two
#: looks (a change across a longer gap proves nothing about now and is looked at afresh).
LOOK_SECONDS = FRESH_WITHIN_SECONDS / 2


def joiners(live: Membership, *, running: Iterable[str], excluded: Iterable[str],
            alive: Iterable[str], admitted: Iterable[str]) -> list[Node]:
    """Nodes that may join the running attempt once gated: in the live membership, not
    among the attempt's (``running`` addresses), not excluded (instance ids), executor
    alive, not admitted already. The master always runs the attempt, so never joins."""
    skip = {*running, *admitted}
    out = set(excluded)
    up = set(alive)
    return [n for n in live.nodes if n.address not in skip and n.instance_id not in out
            and n.address in up and n.address != live.master.address]


@dataclass
class Rejoin:
    """One attempt's replacements: who was admitted, and who joined."""

    jpaths: JobPaths
    uid: int
    gid: int
    admitted: dict[str, str] = field(default_factory=dict)  # address -> instance id
    joined: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)  # the attempt's nodes whose executor was lost
    next_look: float = 0.0

    def __post_init__(self) -> None:
        """A controller that re-attaches to the attempt finds the admissions its predecessor
        wrote: those nodes are not gated again (they may be training already)."""
        with userfiles.as_user(self.uid, self.gid):  # the user's directory, never a link
            try:
                names = [e.name for e in os.scandir(self.jpaths.admitted_dir)]
            except OSError:
                return
            for address in names:
                try:
                    text = userfiles.read_owned(self.jpaths.admitted_dir, address).text
                except OSError:  # not the controller's file: ignored
                    continue
                self.admitted[address] = text.split(" ", 1)[0].strip()

    def due(self) -> bool:
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + LOOK_SECONDS
        return True

    def admit(self, node: Node) -> None:
        """The gate passed on ``node``: its executor may join the attempt."""
        with userfiles.as_user(self.uid, self.gid):  # the user's attempt directory
            self.jpaths.admitted_dir.mkdir(exist_ok=True)
            store.atomic_write(self.jpaths.admitted(node.address),
                               f"{node.instance_id} passed the health gate\n")
        self.admitted[node.address] = node.instance_id
        LOG.info("job %s: replacement %s (%s) passed the health gate: admitted, it joins "
                 "the running attempt", self.jpaths.job_id, node.address, node.instance_id)

    def newly_joined(self) -> list[str]:
        """Admitted addresses whose share of the attempt has started since the last call."""
        started = {rec.address for _s, rec in userfiles.scan(
            self.jpaths.nodes, ShareStarted, suffix=SHARE_STARTED_SUFFIX)}
        new = sorted(a for a in self.admitted if a in started and a not in self.joined)
        self.joined.update(new)
        return new

    def look(self, live: Membership | None, *, running: Iterable[str], excluded: Iterable[str],
             alive: Callable[[Iterable[str]], Iterable[str]],
             gate: Callable[[Membership, list[Node]], list[str]]) -> list[Node]:
        """Gate the nodes that may join (``gate`` marks and excludes failing ones and returns
        their addresses); admit those that passed. Returns the admitted nodes."""
        if live is None:
            return []
        candidates = [n for n in live.nodes if n.address != live.master.address]
        nodes = joiners(live, running=running, excluded=excluded,
                        alive=alive(n.address for n in candidates), admitted=self.admitted)
        if not nodes:
            return []
        failing = set(gate(live, nodes))
        passed = [n for n in nodes if n.address not in failing]
        for node in passed:
            self.admit(node)
        return passed

    def step(self, live: Membership | None, *, running: Iterable[str],
             excluded: Iterable[str], alive: Callable[[Iterable[str]], Iterable[str]],
             gate: Callable[[Membership, list[Node]], list[str]]) -> tuple[list[Node], list[str]]:
        """One look (:meth:`look`), then who joined since: (admitted now, joined now)."""
        admitted = self.look(live, running=running, excluded=excluded, alive=alive, gate=gate)
        joined = self.newly_joined()
        if joined:
            LOG.info("job %s: %s joined the running attempt", self.jpaths.job_id,
                     ", ".join(joined))
        return admitted, joined

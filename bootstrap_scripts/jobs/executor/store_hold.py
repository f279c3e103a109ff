"""The master's share keeps a torchrun job's rendezvous store up until its peers are done.

The store is a helper process of the master's share (``rdzv_store.RDZV_STORE_LABEL``). Once
the master's agent has succeeded, its share stays open, the store serving, until every other
share of the job has exited or its node's executor is gone: no agent loses the store while
it passes torch's exit barrier and closes the rendezvous (why: ``rdzv_store.py``). A failed
or stopped job's store goes at once, so its peers fail fast. :class:`~.shares.Shares` asks
:func:`holding_store` on each pass before it ends a share whose main processes are done.
"""

from __future__ import annotations

import logging

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.running import RunningShare
from bootstrap_scripts.protocol import liveness, store
from bootstrap_scripts.protocol.paths import SHARE_STARTED_SUFFIX
from bootstrap_scripts.protocol.records import ExecutorHeartbeat, ShareStarted

LOG = logging.getLogger("dl-executor")

#: The longest the master's share keeps the store up for peers after its agent succeeded.
#: The others need about a second (their exit barrier's last read and the rendezvous
#: close); this only bounds a peer that hangs after the barrier.
STORE_HOLD_MAX_SECONDS = 30.0


def holding_store(node: ThisNode, r: RunningShare, now: float) -> bool:
    """Whether the master's share, its agent done with success, keeps the job's
    rendezvous store up a little longer because other shares are still finishing."""
    rdzv = r.rdzv_store()
    if rdzv is None or rdzv.popen.poll() is not None or r.cancel_reason or \
            r.returncode() != 0:
        return False  # a failed or stopped job: the store goes now, peers fail fast
    if r.held_since is None:
        r.held_since = now
    waiting = unfinished_peers(node, r, now)
    if waiting and now - r.held_since > STORE_HOLD_MAX_SECONDS:
        LOG.warning("job %s: node rank(s) %s still running %.0f s after this node's "
                    "agent finished; stopping the rendezvous store", r.paths.key,
                    ", ".join(map(str, waiting)), now - r.held_since)
        return False
    if not waiting and r.held_since != now:
        LOG.info("job %s: every other share exited %.1f s after this node's agent; "
                 "stopping the rendezvous store", r.paths.key, now - r.held_since)
    return bool(waiting)


def unfinished_peers(node: ThisNode, r: RunningShare, now: float) -> list[int]:
    """Ranks of the job's other shares (the spec's and, elastic, those that joined)
    with no exit record whose node's executor is still alive."""
    peers = {s.rank: s.address for s in r.spec.shares}
    for _stem, rec in userfiles.scan(r.paths.nodes, ShareStarted,
                                     suffix=SHARE_STARTED_SUFFIX):
        peers.setdefault(rec.rank, rec.address)
    peers.pop(r.share.rank, None)
    return [rank for rank, address in sorted(peers.items())
            if not userfiles.exists(r.paths.exit(rank)) and peer_alive(node, r, address, now)]


def peer_alive(node: ThisNode, r: RunningShare, address: str, now: float) -> bool:
    """A peer's executor is alive by the cluster's one rule (``protocol.liveness``)."""
    beat = store.read_record_or_none(node.cluster.executor_heartbeat(address),
                                     ExecutorHeartbeat)
    verdict, r.peer_beats[address] = liveness.executor(beat, r.peer_beats.get(address), now)
    return not verdict.gone

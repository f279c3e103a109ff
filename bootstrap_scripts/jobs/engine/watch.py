"""Following a published job: tail every node's log, beat the runner's heartbeat, collect the
shares' exits, notice lost, joined and drained nodes, and cancel on failure or signal.

Everything goes through the job directory on EFS (the executors never talk to the runner
directly), so the runner can be restarted elsewhere and still read what happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.engine.outcomes import say
from bootstrap_scripts.protocol import liveness, store
from bootstrap_scripts.protocol.jobs import USER_CANCEL_REASON, JobSpec, Share
from bootstrap_scripts.protocol.liveness import Liveness, Sighting
from bootstrap_scripts.protocol.paths import (
    SHARE_LOG_SUFFIX,
    SHARE_STARTED_SUFFIX,
    ClusterPaths,
    JobPaths,
    parse_share_file,
)
from bootstrap_scripts.protocol.records import (
    ExecutorHeartbeat,
    RunnerHeartbeat,
    ShareExit,
    ShareStarted,
)
from bootstrap_scripts.protocol.run_request import RunRequest

#: An executor that says it stopped while its share runs may be restarting (systemd brings
#: it back and it re-attaches to the share): lost only if it still says so this much later.
RESTART_GRACE_SECONDS = 2.0


class LogTailer:
    """Follows every ``nodes/<rank>[-<label>].log`` of a job and prints new complete lines
    with a ``[rank address label]`` prefix."""

    def __init__(self, nodes: Path, spec: JobSpec, *, prefix: bool = True,
                 ranks: frozenset[int] | None = None):
        self.nodes = nodes
        self.addresses = {s.rank: s.address for s in spec.shares}
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}
        self.prefix = prefix
        self.ranks = ranks  # None: every rank's log

    def line_prefix(self, name: str) -> str:
        parsed = parse_share_file(name, SHARE_LOG_SUFFIX)
        if parsed is None:
            return f"[{name.removesuffix(SHARE_LOG_SUFFIX)}] "
        rank, label = parsed
        if rank not in self.addresses:
            # An elastic joiner: its rank is not in the spec; its share's start record
            # (``nodes/<rank>.started``, written before its log) names its node.
            rec = userfiles.read_record_or_none(self.nodes / f"{rank}{SHARE_STARTED_SUFFIX}",
                                                ShareStarted)
            if rec is not None and rec.address:
                self.addresses[rank] = rec.address
        addr = self.addresses.get(rank, "?")
        return f"[{rank} {addr}{' ' + label if label else ''}] "

    def poll(self, *, final: bool = False) -> None:
        try:
            names = sorted(e.name for e in os.scandir(self.nodes)
                           if e.name.endswith(SHARE_LOG_SUFFIX))
        except FileNotFoundError:
            return
        if self.ranks is not None:
            names = [n for n in names if (parse_share_file(n, SHARE_LOG_SUFFIX) or (-1, ""))[0]
                     in self.ranks]
        out = []
        for name in names:
            # never through a link: root prints these too (``dl-jobs logs`` for operators)
            data = userfiles.read_from(self.nodes / name, self.offsets.get(name, 0))
            if data is None:
                continue
            if not data and not (final and self.partial.get(name)):
                continue
            self.offsets[name] = self.offsets.get(name, 0) + len(data)
            buf = self.partial.get(name, b"") + data
            *lines, rest = buf.split(b"\n")
            if final and rest:
                lines.append(rest)
                rest = b""
            self.partial[name] = rest
            pre = self.line_prefix(name) if self.prefix else ""
            out += [pre + line.decode(errors="replace").rstrip("\r") for line in lines]
        if out:
            sys.stdout.write("\n".join(out) + "\n")
            sys.stdout.flush()


@dataclass
class Watch:
    """What the runner knows about its job while it runs (and, at the end, its outcome)."""

    spec: JobSpec
    paths: JobPaths
    efs: Path
    request: RunRequest
    exits: dict[int, ShareExit] = field(default_factory=dict)
    signal_received: int = 0
    signals: int = 0
    tailer: LogTailer | None = None
    cancelled_at: float | None = None
    first_failure_at: float | None = None
    lost: dict[int, str] = field(default_factory=dict)
    lost_at: dict[int, float] = field(default_factory=dict)
    #: every share of the job: the spec's, plus (elastic) those of nodes that joined
    shares: list[Share] = field(default_factory=list)
    left: dict[int, str] = field(default_factory=dict)  # elastic: drained / lost, tolerated
    #: the job's user cancelled it through its cancel file (``USER_CANCEL_REASON``): the
    #: result says ``cancelled``
    user_cancelled: bool = False

    def __post_init__(self) -> None:
        self.shares = list(self.spec.shares)

    def settled(self, rank: int) -> bool:
        """The share exited, was lost, or left the (elastic) job."""
        return rank in self.exits or rank in self.lost or rank in self.left

    def active(self) -> int:
        return sum(1 for s in self.shares if not self.settled(s.rank))

    def cancel(self, why: str) -> None:
        if self.cancelled_at is None:
            self.cancelled_at = time.monotonic()
            say(f"stopping the job on every node ({why})")
            with contextlib.suppress(OSError):
                store.atomic_write(self.paths.cancel, why + "\n")


def install_signal_handlers(w: Watch) -> dict:
    """From before the spec is published: a signal can never leave shares unstopped."""
    def on_signal(signum: int, _frame: object) -> None:
        w.signals += 1
        w.signal_received = w.signal_received or signum
        if w.signals > 1:
            raise KeyboardInterrupt  # second Ctrl-C: stop waiting (cancel is already out)

    return {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}


def beat(paths: JobPaths, seq: int) -> None:
    """The runner's heartbeat: executors stop the job's shares once it stops moving."""
    store.write_record(paths.runner_heartbeat,
                       RunnerHeartbeat(seq=seq, pid=os.getpid(), time=time.time()))


def collect_exits(w: Watch, now: float) -> None:
    """Record every share's exit as it appears; the first failure starts ``--fail-grace``."""
    for share in list(w.shares):
        if share.rank in w.exits:
            continue
        rec = store.read_record_or_none(w.paths.exit(share.rank), ShareExit)
        if rec is None:
            continue
        w.exits[share.rank] = rec
        if w.spec.elastic and rec.drained:
            w.left[share.rank] = "drained"
            say(f"node {share.rank} ({share.address}) left the job (drained):"
                f" {w.active()} node(s) now")
        elif rec.returncode != 0 and w.first_failure_at is None and share.rank not in w.left:
            w.first_failure_at = now
            say(f"node {share.rank} ({share.address}) exited with code {rec.returncode}")


def watch(w: Watch, old_handlers: dict) -> Watch:
    """Follow the job until every share settled (or a cancel went unconfirmed too long);
    ``old_handlers`` are restored on the way out."""
    args = w.request
    tailer = LogTailer(w.paths.nodes, w.spec, prefix=args.prefix)
    w.tailer = tailer
    started_at = time.monotonic()
    beat_seq, next_beat = 0, 0.0
    hb_seen: dict[str, Sighting] = {}
    acked: set[int] = set()
    try:
        while True:
            now = time.monotonic()
            if now >= next_beat:
                beat_seq += 1
                beat(w.paths, beat_seq)
                next_beat = now + 1.0
                check_nodes(w, hb_seen, acked, started_at)
                if w.cancelled_at is None:
                    noticed_user_cancel(w, now)
            if w.signal_received and w.cancelled_at is None:
                w.cancel(f"runner got {signal.Signals(w.signal_received).name}")
            tailer.poll()
            collect_exits(w, now)
            if w.shares and all(w.settled(s.rank) for s in w.shares):
                if w.cancelled_at is None:  # the shares may end before a look at it
                    noticed_user_cancel(w, now)
                break
            if w.lost and w.cancelled_at is None:
                w.cancel("lost node(s): " + ", ".join(w.lost.values()))
            if w.first_failure_at is not None and w.cancelled_at is None and \
                    now - w.first_failure_at > args.fail_grace:
                w.cancel(f"a node failed {args.fail_grace:.0f} s ago")
            if w.cancelled_at is not None and \
                    now - w.cancelled_at > args.grace + args.heartbeat_timeout + 5:
                say("some nodes did not confirm the stop; giving up waiting")
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        w.cancel("interrupted")
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        tailer.poll(final=True)
    return w


def noticed_user_cancel(w: Watch, now: float) -> None:
    """Someone else wrote the job's cancel file: its user (``USER_CANCEL_REASON``), through
    ``dl-jobs cancel`` or the job controller. The executors stop the shares by themselves;
    the runner takes it as its own cancel (no second reason written over it)."""
    text = store.read_text(w.paths.cancel)
    if text is not None and text.startswith(USER_CANCEL_REASON):
        w.cancelled_at, w.user_cancelled = now, True
        say(f"stopping the job on every node ({text.strip()})")


def check_nodes(w: Watch, hb_seen: dict[str, Sighting], acked: set[int],
                started_at: float) -> None:
    """Once a second: executors still alive (heartbeat moving), shares acknowledged; in an
    elastic job, also nodes that joined (a ``.started`` for a rank the spec does not have)
    and nodes lost while the others carry on (torchrun re-rendezvous without them)."""
    now = time.monotonic()
    if w.spec.elastic:
        discover_joined(w)
    cluster = ClusterPaths(w.efs)
    for share in w.shares:
        if w.settled(share.rank):
            continue
        if share.rank not in acked:
            if store.exists(w.paths.started(share.rank)):
                acked.add(share.rank)
            elif now - started_at > w.request.start_timeout:
                w.lost[share.rank] = (f"node {share.rank} ({share.address}) did not start its "
                                      f"share within {w.request.start_timeout:.0f} s")
                continue
        hb = store.read_record_or_none(cluster.executor_heartbeat(share.address),
                                       ExecutorHeartbeat)
        verdict, hb_seen[share.address] = liveness.executor(
            hb, hb_seen.get(share.address), now, w.request.heartbeat_timeout)
        restarting = (verdict is Liveness.STOPPED
                      and now - hb_seen[share.address].since < RESTART_GRACE_SECONDS)
        if verdict.gone and not restarting and \
                store.read_record_or_none(w.paths.exit(share.rank), ShareExit) is None:
            why = (f"node {share.rank} ({share.address}): executor heartbeat stopped "
                   f"{now - hb_seen[share.address].since:.0f} s ago")
            if w.spec.elastic and share.rank != 0 and w.active() > 1:
                w.left[share.rank] = why
                w.lost_at[share.rank] = time.time()
                say(f"{why}: lost; the elastic job continues on {w.active()} node(s)")
            else:
                w.lost[share.rank] = why
                w.lost_at[share.rank] = time.time()


def discover_joined(w: Watch) -> None:
    """Shares that executors of joining nodes started in an elastic job: a ``.started`` for
    a rank the runner does not know yet (the rank the node claimed)."""
    known = {s.rank for s in w.shares}
    try:
        names = sorted(e.name for e in os.scandir(w.paths.nodes))
    except FileNotFoundError:
        return
    for name in names:
        parsed = parse_share_file(name, SHARE_STARTED_SUFFIX)
        if parsed is None or parsed[0] in known:
            continue
        rank = parsed[0]
        rec = store.read_record_or_none(w.paths.started(rank), ShareStarted)
        if rec is None or not rec.address:
            continue
        share = Share(rank, rec.address, ())
        w.shares.append(share)
        known.add(rank)
        if w.tailer is not None:
            w.tailer.addresses[rank] = share.address
        say(f"node {rank} ({share.address}) joined the job: {w.active()} node(s) now")

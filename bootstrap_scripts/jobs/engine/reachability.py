"""Is a node's job executor there? The cluster's one liveness rule, for everyone who asks.

Every observer judges an executor by :mod:`bootstrap_scripts.protocol.liveness`: its
heartbeat's ``seq`` must keep changing, timed on the observer's own monotonic clock (never
the writer's timestamp against the observer's clock, never file mtimes). An observer keeps
its sightings in one :class:`Executors`; what each asks of it differs only in how much
evidence it needs before acting:

- the runner, before it publishes a job (:func:`check_reachable`): a heartbeat that exists
  and does not say "stopped" (no executor at all, or one that stopped, fails in seconds and
  names the node; one that died without saying so is found by the same rule while the job
  runs, :mod:`.watch`, within ``--heartbeat-timeout``);
- the job controller, when it picks an attempt's nodes: executors seen *moving*
  (:meth:`Executors.alive`), and while it waits for an attempt's shares to stop: executors
  not yet ``gone`` (:meth:`Executors.gone`);
- the health gate, before it sends a node its checks: seen moving within its budget
  (:meth:`Executors.wait`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bootstrap_scripts.jobs.engine.outcomes import EXIT_UNREACHABLE, RunError
from bootstrap_scripts.protocol import liveness, store
from bootstrap_scripts.protocol.liveness import EXECUTOR_SILENT_SECONDS, Liveness, Sighting
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat

#: How often a waiting observer looks again (executors beat every ~1 s).
LOOK_SECONDS = 0.2
#: How long a one-off observer (the gate, dl-health) looks for a heartbeat to move before
#: it calls the executor not alive: a few of its ~1 s beats.
MOVE_WITHIN_SECONDS = 3.0
#: A change seen across a longer gap between two looks proves nothing about *now* (the
#: executor may have beaten once and died since): such a look starts the sighting afresh.
#: No change across any gap is silence all along, and counts as such.
FRESH_WITHIN_SECONDS = 2.0


def read_heartbeat(efs: Path, address: str) -> ExecutorHeartbeat | None:
    """The executor heartbeat of ``address``, None when missing, unreadable or larger than
    a node's record may be (``store.NODE_RECORD_LIMIT``: root on any worker writes there)."""
    return store.read_record_or_none(ClusterPaths(efs).executor_heartbeat(address),
                                     ExecutorHeartbeat, limit=store.NODE_RECORD_LIMIT)


#: Why a signed heartbeat older than one seen is not believed (the readers' log and tools).
REPLAY = "older than a heartbeat seen already: a replay"


class LatestBeats:
    """The replay rule of the master's readers of signed executor heartbeats (the job
    controller, ``dl-health``): a beat older than one already seen (``started_at``, then
    ``seq``) is no beat. Root on any worker can put back a node's own older beat it saved,
    signed by the node: read as it is, beats alternating with the latest would "move" a
    dead node's heartbeat. Only beats whose signature was checked may be given here: an
    unchecked one with a made-up large ``seq`` would turn every real beat into a "replay"."""

    def __init__(self) -> None:
        self.latest: dict[str, ExecutorHeartbeat] = {}

    def get(self, address: str) -> ExecutorHeartbeat | None:
        """The latest beat believed of ``address`` (None: none yet)."""
        return self.latest.get(address)

    def take(self, address: str, beat: ExecutorHeartbeat | None
             ) -> tuple[ExecutorHeartbeat | None, bool]:
        """What counts as ``address``'s heartbeat after reading ``beat`` (signed by its
        node; None: missing or not believed), and whether ``beat`` was a replay. What does
        not count is as if the file had not changed: the latest believed stays."""
        last = self.latest.get(address)
        if beat is None:
            return last, False
        if last is not None and (beat.started_at, beat.seq) < (last.started_at, last.seq):
            return last, True
        self.latest[address] = beat
        return beat, False


def why_not(verdict: Liveness, silent_after: float) -> str:
    """What a verdict says is wrong with an executor, for messages ("" when nothing)."""
    return {Liveness.MISSING: "no executor heartbeat",
            Liveness.STOPPED: "executor stopped",
            Liveness.SILENT: f"executor heartbeat unchanged for {silent_after:.0f} s",
            }.get(verdict, "")


class Executors:
    """One observer's sightings of the executors' heartbeats, judged by the one rule."""

    def __init__(self, efs: Path, silent_after: float = EXECUTOR_SILENT_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 read: Callable[[Path, str], ExecutorHeartbeat | None] = read_heartbeat) -> None:
        self.efs = efs
        #: how a heartbeat is read (the job controller's believes only signed ones:
        #: ``jobs.controller.node_heartbeats``)
        self.read = read
        self.silent_after = silent_after
        self.clock = clock
        self.seen: dict[str, Sighting] = {}
        self.looked: dict[str, float] = {}

    def look(self, address: str) -> tuple[Liveness, ExecutorHeartbeat | None]:
        """Read ``address``'s heartbeat now and judge it against what was seen before (a
        change across a gap longer than :data:`FRESH_WITHIN_SECONDS` must be seen again)."""
        now = self.clock()
        last = self.seen.get(address)
        beat = self.read(self.efs, address)
        if last is not None and (beat.seq if beat else None) != last.seq and \
                now - self.looked.get(address, now) > FRESH_WITHIN_SECONDS:
            last = None  # moved at some point in a long gap: prove it again (no change is
            # still evidence: silence since the last look is silence)
        verdict, self.seen[address] = liveness.executor(beat, last, now, self.silent_after)
        self.looked[address] = now
        return verdict, beat

    def gone(self, addresses: Iterable[str]) -> dict[str, str]:
        """The addresses whose executor is gone (stopped, or silent / missing for
        ``silent_after`` of this observer's time), each with why."""
        out = {}
        for address in addresses:
            verdict, _beat = self.look(address)
            if verdict.gone:
                out[address] = why_not(verdict, self.silent_after)
        return out

    def quiet(self, addresses: Iterable[str], after: float) -> list[str]:
        """The addresses whose heartbeat this observer has not seen change for ``after`` s,
        though not long enough to call the executor gone: a verdict on its way."""
        out = []
        for address in addresses:
            verdict, _beat = self.look(address)
            seen = self.seen[address]
            if not verdict.gone and self.clock() - seen.since > after:
                out.append(address)
        return out

    def alive(self, addresses: Iterable[str]) -> list[str]:
        """The addresses whose executor this observer has seen moving (and not since gone
        silent): ready to be given work."""
        return [a for a in addresses if self.look(a)[0] is Liveness.ALIVE]

    def wait(self, addresses: Iterable[str], timeout: float,
             sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
        """Look until every address is alive or gone, at most ``timeout`` s: the ones not
        seen alive, each with why (a slow but moving executor is alive within ~1 s)."""
        pending = list(addresses)
        deadline = self.clock() + timeout
        problems: dict[str, str] = {}
        while pending:
            for address in list(pending):
                verdict, _beat = self.look(address)
                if verdict is Liveness.ALIVE:
                    pending.remove(address)
                elif verdict.gone:
                    problems[address] = why_not(verdict, self.silent_after)
                    pending.remove(address)
            if pending and self.clock() >= deadline:
                for address in pending:
                    problems[address] = (f"executor heartbeat not seen to change in "
                                         f"{timeout:.0f} s")
                break
            if pending:
                sleep(LOOK_SECONDS)
        return problems


def check_reachable(efs: Path, addresses: list[str], *, timeout: float,
                    reach_timeout: float) -> None:
    """Fail fast, before anything is published, naming every address with no executor or
    a stopped one (each gets ``reach_timeout`` s to appear or restart). An executor that
    died without a word is the watch's to find, by the same rule, ``timeout`` s in."""
    del timeout  # the watch's: the rule needs time to call a silent executor gone
    deadline = time.monotonic() + reach_timeout
    while True:
        problems = {}
        for address in addresses:
            beat = read_heartbeat(efs, address)
            if beat is None:
                problems[address] = why_not(Liveness.MISSING, 0)
            elif beat.state == "stopped":
                problems[address] = why_not(Liveness.STOPPED, 0)
        if not problems or time.monotonic() >= deadline:
            break
        time.sleep(LOOK_SECONDS)
    if problems:
        detail = "; ".join(f"{a}: {why}" for a, why in sorted(problems.items()))
        raise RunError(f"cannot reach node(s) {', '.join(sorted(problems))} ({detail}); "
                       f"is the job executor running there? (heartbeats under "
                       f"{ClusterPaths(efs).executors_dir})", EXIT_UNREACHABLE)

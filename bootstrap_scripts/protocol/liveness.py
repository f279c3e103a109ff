"""Whether the writer of a heartbeat is alive: one rule, one clock, for every observer.

A heartbeat record (an executor's ``cluster/executors/<address>.json``, a runner's
``jobs/<id>/runner.json``) carries a ``seq`` its writer bumps every second. Its writer is
judged by whether that value CHANGES, timed on the OBSERVER's own monotonic clock: never by
comparing the writer's wall-clock timestamp with the observer's (two machines' clocks, and
either may jump), nor by file mtimes (the file server's clock).

The rule (:func:`judge`), given what the observer saw last (:class:`Sighting`):

- ``stopped``: the writer said so (its last heartbeat has ``state == "stopped"``);
- ``silent`` (``missing`` if there has been no heartbeat at all): the value has not changed
  for ``silent_after`` seconds since the observer first saw it (a writer seen for the first
  time gets that long to prove itself; an unreadable heartbeat counts as none);
- ``alive``: the observer has seen the value change, and not ``silent_after`` ago;
- ``presumed``: first seen less than ``silent_after`` ago, not seen to change yet.

Who asks: the executor (peers holding a job's rendezvous store; a job's runner, before
starting a job found at start-up and while a share runs), the runner (its executors while a
job runs), the job controller (executors when it picks an attempt's nodes and while it waits
for an attempt to stop) and the health gate (before it sends a node its checks): the last
three through ``jobs.engine.reachability.Executors``. Each keeps its own sightings; the rule
is this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from bootstrap_scripts.protocol.records import ExecutorHeartbeat, RunnerHeartbeat

#: An executor beats every ~1 s; silent this long (observer's clock) = lost. The runner's
#: ``--heartbeat-timeout`` default.
EXECUTOR_SILENT_SECONDS = 10.0


class Liveness(StrEnum):
    ALIVE = "alive"
    PRESUMED = "presumed"
    SILENT = "silent"
    STOPPED = "stopped"
    MISSING = "missing"

    @property
    def gone(self) -> bool:
        """Give up on the writer (the other two: keep counting on it)."""
        return self in (Liveness.SILENT, Liveness.STOPPED, Liveness.MISSING)


@dataclass(frozen=True)
class Sighting:
    """What an observer last saw of one heartbeat: its ``seq`` (None: no heartbeat), since
    when (the observer's ``time.monotonic()``) and whether it has been seen to change."""

    seq: int | None
    since: float
    moved: bool = False


def judge(seq: int | None, *, stopped: bool, last: Sighting | None, now: float,
          silent_after: float) -> tuple[Liveness, Sighting]:
    """The writer's liveness and the sighting to remember (pure: ``now`` is the caller's
    ``time.monotonic()``)."""
    if last is None:
        sighting = Sighting(seq, now)
    elif seq != last.seq:
        sighting = Sighting(seq, now, moved=True)
    else:
        sighting = last
    if stopped:
        return Liveness.STOPPED, sighting
    if now - sighting.since > silent_after:
        return (Liveness.MISSING if seq is None else Liveness.SILENT), sighting
    return (Liveness.ALIVE if sighting.moved else Liveness.PRESUMED), sighting


def executor(beat: ExecutorHeartbeat | None, last: Sighting | None, now: float,
             silent_after: float = EXECUTOR_SILENT_SECONDS) -> tuple[Liveness, Sighting]:
    """:func:`judge` for a job executor's heartbeat record."""
    return judge(beat.seq if beat else None, stopped=bool(beat and beat.state == "stopped"),
                 last=last, now=now, silent_after=silent_after)


def runner(beat: RunnerHeartbeat | None, last: Sighting | None, now: float,
           silent_after: float) -> tuple[Liveness, Sighting]:
    """:func:`judge` for a job runner's heartbeat record."""
    return judge(beat.seq if beat else None, stopped=False, last=last, now=now,
                 silent_after=silent_after)

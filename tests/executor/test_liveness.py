"""The cluster's one liveness rule (``protocol.liveness.judge``), as a table, and the
executor's watchers that use it."""

from __future__ import annotations

import pytest

from bootstrap_scripts.protocol import liveness
from bootstrap_scripts.protocol.liveness import Liveness, Sighting, judge
from bootstrap_scripts.protocol.records import ExecutorHeartbeat

LIMIT = 10.0


@pytest.mark.parametrize(("seq", "stopped", "last", "now", "expected"), [
    # first sight: presumed alive for the limit, then silent
    (5, False, None, 100.0, Liveness.PRESUMED),
    (5, False, Sighting(5, 100.0), 109.0, Liveness.PRESUMED),
    (5, False, Sighting(5, 100.0), 110.5, Liveness.SILENT),
    # seen to change: alive, until unchanged for the limit
    (6, False, Sighting(5, 100.0), 101.0, Liveness.ALIVE),
    (6, False, Sighting(6, 101.0, moved=True), 110.0, Liveness.ALIVE),
    (6, False, Sighting(6, 101.0, moved=True), 111.5, Liveness.SILENT),
    # a heartbeat that appears counts as a change
    (0, False, Sighting(None, 100.0), 101.0, Liveness.ALIVE),
    # none at all: missing once the limit is over
    (None, False, None, 100.0, Liveness.PRESUMED),
    (None, False, Sighting(None, 100.0), 110.5, Liveness.MISSING),
    # the writer says it stopped: at once, moving or not
    (7, True, Sighting(6, 100.0, moved=True), 101.0, Liveness.STOPPED),
    (7, True, None, 100.0, Liveness.STOPPED),
])
def test_the_rule(seq, stopped, last, now, expected):
    verdict, _ = judge(seq, stopped=stopped, last=last, now=now, silent_after=LIMIT)
    assert verdict is expected


def test_the_clock_is_the_observers_own():
    """A writer whose wall clock is an hour off is alive as long as its seq moves."""
    beat = ExecutorHeartbeat(address="a", heartbeat=0.0, seq=1, state="running")
    verdict, seen = liveness.executor(beat, None, now=5.0)
    later = ExecutorHeartbeat(address="a", heartbeat=-3600.0, seq=2, state="running")
    verdict, seen = liveness.executor(later, seen, now=6.0)
    assert verdict is Liveness.ALIVE and not verdict.gone
    verdict, _ = liveness.executor(later, seen, now=6.0 + liveness.EXECUTOR_SILENT_SECONDS + 1)
    assert verdict.gone

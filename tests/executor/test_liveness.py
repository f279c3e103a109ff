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


# -- every other observer: jobs.engine.reachability.Executors ---------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def beat_file(efs, address: str, seq: int, *, heartbeat: float = 0.0,
              state: str = "running") -> None:
    from bootstrap_scripts.protocol import store
    from bootstrap_scripts.protocol.paths import ClusterPaths
    store.write_record(ClusterPaths(efs).executor_heartbeat(address), ExecutorHeartbeat(
        address=address, heartbeat=heartbeat, seq=seq, state=state))


def test_observers_judge_by_movement_not_by_the_writers_clock(tmp_path):
    """The controller, the gate and dl-health no longer compare a heartbeat's timestamp with
    their own clock: an hour-old timestamp that moves is alive, a fresh one that does not
    is gone once the limit is over."""
    from bootstrap_scripts.jobs.engine.reachability import Executors
    clock = FakeClock()
    ex = Executors(tmp_path, silent_after=LIMIT, clock=clock)
    beat_file(tmp_path, "skewed", 1, heartbeat=-3600.0)
    beat_file(tmp_path, "frozen", 1, heartbeat=10**10)
    assert ex.alive(["skewed", "frozen"]) == []  # first sight proves nothing yet
    clock.now += 1.0
    beat_file(tmp_path, "skewed", 2, heartbeat=-3599.0)
    assert ex.alive(["skewed", "frozen"]) == ["skewed"]
    assert ex.gone(["skewed", "frozen"]) == {}
    clock.now += LIMIT + 1
    assert ex.gone(["frozen"]) == {"frozen": f"executor heartbeat unchanged for {LIMIT:.0f} s"}


def test_a_change_seen_across_a_long_gap_proves_nothing_about_now(tmp_path):
    """An observer that looked before an attempt and again after it must not call an
    executor alive because its seq changed in between (it may have died since)."""
    from bootstrap_scripts.jobs.engine.reachability import FRESH_WITHIN_SECONDS, Executors
    clock = FakeClock()
    ex = Executors(tmp_path, silent_after=LIMIT, clock=clock)
    beat_file(tmp_path, "a", 1)
    ex.alive(["a"])
    clock.now += FRESH_WITHIN_SECONDS + 5
    beat_file(tmp_path, "a", 9)  # beat during the gap, then died
    assert ex.alive(["a"]) == []
    clock.now += 0.5
    assert ex.alive(["a"]) == []  # still unchanged since the fresh look


def test_wait_returns_each_executors_fate(tmp_path):
    from bootstrap_scripts.jobs.engine.reachability import Executors
    clock = FakeClock()
    ex = Executors(tmp_path, silent_after=LIMIT, clock=clock)
    beat_file(tmp_path, "live", 1)
    beat_file(tmp_path, "stopped", 1, state="stopped")
    beat_file(tmp_path, "dead", 1)
    seq = iter(range(2, 100))

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        beat_file(tmp_path, "live", next(seq))

    problems = ex.wait(["live", "stopped", "dead", "none"], timeout=3.0, sleep=sleep)
    assert problems == {"stopped": "executor stopped",
                        "dead": "executor heartbeat not seen to change in 3 s",
                        "none": "executor heartbeat not seen to change in 3 s"}
    assert 3.0 <= clock.now - 1000.0 < 3.5


def test_an_executor_quiet_for_a_while_is_named_before_it_is_gone(tmp_path):
    """``quiet``: unchanged for ``after`` s on this observer's clock, not yet gone (the
    controller holds a hang verdict back meanwhile: the node may be lost)."""
    from bootstrap_scripts.jobs.engine.reachability import Executors
    clock = FakeClock()
    ex = Executors(tmp_path, silent_after=LIMIT, clock=clock)
    beat_file(tmp_path, "a", 1)
    beat_file(tmp_path, "b", 1)
    assert ex.quiet(["a", "b"], after=3.0) == []
    clock.now += 2.0
    beat_file(tmp_path, "a", 2)
    assert ex.quiet(["a", "b"], after=3.0) == []
    clock.now += 2.0
    assert ex.quiet(["a", "b"], after=3.0) == ["b"]  # 4 s unchanged; a moved 2 s ago
    clock.now += LIMIT
    assert ex.quiet(["a", "b"], after=3.0) == []  # both gone now: no longer a question

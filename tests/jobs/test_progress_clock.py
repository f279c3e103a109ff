"""A wall-clock jump publishes no bogus step time (``bootstrap_scripts/progress.py``): step
durations and the write interval are measured on a monotonic clock; the record's ``time``
stays the wall clock's (other nodes read it)."""

from __future__ import annotations

import json

from bootstrap_scripts.progress import Reporter


def test_a_wall_clock_jump_between_two_steps_is_not_a_slow_step(tmp_path):
    wall, mono = [1000.0], [50.0]
    rep = Reporter(tmp_path, 0, interval=0.0, clock=lambda: wall[0],
                   monotonic=lambda: mono[0], catch_up=False)
    rep.report(1)
    wall[0] += 200.0  # NTP stepped the clock (or the VM was resumed)
    mono[0] += 0.25
    rep.report(2)
    rec = json.loads((tmp_path / "0.json").read_text())
    assert rec["step_seconds"] == 0.25, rec
    assert rec["time"] == 1200.0  # the wall clock's, as other nodes compare it


def test_a_reporter_on_the_real_clocks_measures_on_the_monotonic_one(tmp_path):
    import time

    rep = Reporter(tmp_path, 0, interval=0.0, catch_up=False)
    assert rep.monotonic is time.monotonic and rep.clock is time.time

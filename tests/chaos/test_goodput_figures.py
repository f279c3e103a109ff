"""The goodput bench's arithmetic (``goodput.py``) on made-up progress samples: generations,
the final history's productive step time, and each fault's figures (fast, in ``make test``)."""

from __future__ import annotations

import pytest

from tests.chaos.goodput import (
    fault_figures,
    generations,
    productive_seconds,
    report,
    run_figures,
)
from tests.support.goodput_samples import run, schedule


def test_generations_their_sizes_first_steps_and_step_times():
    gens = generations(schedule())
    assert [(g.first_step, g.last_step, g.size) for g in gens] == [(1, 20, 4), (19, 30, 3),
                                                                  (31, 40, 4)]
    assert 19 not in gens[1].seconds and gens[1].seconds[20] == 0.5  # first step: start-up


def test_a_redone_step_counts_once_and_first_steps_count_as_the_median():
    total, steps = productive_seconds(generations(schedule()))
    assert steps == 40 and total == pytest.approx(40 * 0.5)


def test_a_faults_figures():
    gens = generations(schedule())
    f = fault_figures("worker killed", 110.0, gens, full_size=4, detected_at=114.0)
    assert (f.detected_s, f.again_s, f.again_size, f.full_s, f.lost_steps) == (
        4.0, 10.0, 3, 20.0, 2)
    none = fault_figures("late", 500.0, gens, full_size=4, detected_at=None)
    assert (none.detected_s, none.again_s, none.lost_steps) == (None, None, None)


def test_ettr_and_the_report():
    r = run_figures("elastic", schedule(), [("worker killed", 110.0, 114.0, "")],
                    full_size=4, job_span=(90.0, 140.0))
    assert r.training_s == pytest.approx(134.5 - 99.5)
    assert r.training_ettr == pytest.approx(20.0 / 35.0)
    assert r.wall_s == 50.0 and r.ettr == pytest.approx(20.0 / 50.0)  # the job's record
    assert r.reference_s == 0.5 and r.fault_free_ratio == pytest.approx(40 * 0.5 / 50.0)
    waiting = run_figures("wait", run(1, 1, 0.0, 1, 40, ranks=4, step_s=1.0), [],
                          full_size=4)
    assert waiting.ettr == pytest.approx(1.0)  # no fault: every second trained
    text = report([waiting, r], full_size=4)
    assert "ETTR elastic / wait = " in text and "10.0 s on 3" in text
    assert "productive step time" in text  # the legend defines the figure


def test_where_the_wall_time_went():
    """Launch 9.5 s (90 -> the first step's start 99.5), 10 + 4 s between generations (109.5
    -> 119.5, 125.5 -> 129.5), end 5.5 s (134.5 -> 140): with the 20 s productive and the
    two redone steps (1 s), the job's 50 s."""
    r = run_figures("elastic", schedule(), [], full_size=4, job_span=(90.0, 140.0))
    assert (r.launch_s, r.between_s, r.end_s) == pytest.approx((9.5, 14.0, 5.5))
    assert r.launch_s + r.between_s + r.end_s + r.productive_s + 2 * 0.5 == \
        pytest.approx(r.wall_s)
    assert "between generations 14.0 s" in report([r], full_size=4)

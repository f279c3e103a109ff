"""The goodput bench's wall-time breakdown and projection (``goodput_breakdown.py``) on
made-up generations: the rows add up to the wall time, each idle stretch is named by its
cause, and the projection's arithmetic (fast, in ``make test``)."""

from __future__ import annotations

import pytest

from tests.chaos import goodput_breakdown as bd
from tests.chaos.goodput import generations
from tests.support.goodput_samples import run, schedule


def elastic_breakdown() -> bd.Breakdown:
    # schedule(): 4 ranks steps 1..20 (start 99.5, last 109.5); a worker killed at 110
    # (recorded 114); 3 survivors from step 19 (start 119.5 .. 125.5); the replacement
    # registered at 125; 4 ranks from step 31 (start 129.5 .. 134.5); the job 90 -> 140
    return bd.breakdown(generations(schedule()), [("worker killed", 110.0, 114.0)],
                        productive_s=20.0, job_span=(90.0, 140.0), registrations=[125.0],
                        attempts=[(1, 90.0)])


def test_the_rows_add_up_to_the_wall_time_and_name_each_idle_stretch():
    b = elastic_breakdown()
    rows = dict(b.rows)
    assert rows["launch: job start -> first step"] == pytest.approx(9.5)
    assert rows["steps redone (work lost since a checkpoint)"] == pytest.approx(1.0)
    assert rows["idle 1: worker killed #1"] == pytest.approx(10.0)
    assert rows[f"idle 2: {bd.JOINED}"] == pytest.approx(4.0)
    assert rows["end: last step -> job end"] == pytest.approx(5.5)
    assert rows["unattributed (overlapping generations, sampling)"] == pytest.approx(0.0)
    assert sum(rows.values()) == pytest.approx(b.wall_s) and b.wall_s == 50.0
    assert b.fault_cost(0) == pytest.approx(14.0)  # its own stretch and its replacement's join
    first = b.gaps[0]
    assert [(w, round(t - first.start, 1)) for w, t in first.events] == [
        ("fault injected", 0.5), ("controller's record", 4.5)]
    text = "\n".join(bd.lines(b))
    assert "total (the job record: start -> end)" in text and "= wall 50.0 s" in text


def test_unattributed_keeps_the_sum_honest():
    """A productive figure that the generations do not account for shows up as
    unattributed, never silently absorbed."""
    b = bd.breakdown(generations(schedule()), [], productive_s=18.0, job_span=(90.0, 140.0))
    rows = dict(b.rows)
    assert rows["unattributed (overlapping generations, sampling)"] == pytest.approx(2.0)
    assert rows["idle 1: other"] == 10.0 and rows["idle 2: other"] == 4.0  # no cause seen
    assert sum(rows.values()) == pytest.approx(50.0)


def test_a_waiting_jobs_loss_carries_the_registration_and_the_new_attempt():
    # 4 ranks steps 1..20; killed at 110, recorded 120, the replacement registered 130, the
    # next attempt started 131, 4 ranks again from step 19 at 145 (start 144.5)
    samples = run(1, 100, 100.0, 1, 20, ranks=4) + run(2, 200, 145.0, 19, 40, ranks=4)
    b = bd.breakdown(generations(samples), [("worker killed", 110.0, 120.0)],
                     productive_s=20.0, job_span=(90.0, 160.0), registrations=[130.0],
                     attempts=[(1, 90.0), (2, 131.0)])
    gap = b.gaps[0]
    assert gap.cause == "worker killed #1" and gap.seconds == pytest.approx(35.0)
    assert [w for w, _t in gap.events] == ["fault injected", "controller's record",
                                           "replacement registered", "attempt 2 started"]
    costs = bd.projected_fault_cost(b, ["worker killed"], shrunk_s={}, full_size=4,
                                    shrunk_size=3, boot_scaled=20.0, boot_real=240.0,
                                    waited={0: True}, step_s=0.5, lost_steps={0: 2})
    assert costs == [pytest.approx(35.0 + 1.0 + 220.0)]  # idle, redone, the real boot


def test_an_elastic_loss_is_charged_the_missing_nodes_share_of_the_real_boot():
    b = elastic_breakdown()
    costs = bd.projected_fault_cost(b, ["worker killed"], shrunk_s={0: 6.0}, full_size=4,
                                    shrunk_size=3, boot_scaled=20.0, boot_real=240.0,
                                    waited={}, step_s=0.5, lost_steps={0: 2})
    assert costs == [pytest.approx(14.0 + 1.0 + 0.25 * (6.0 - 20.0 + 240.0))]


def test_the_projection():
    [p] = bd.projection([360.0], launch_end_s=36.0, work_h=1.0, mtbfs_h=(0.5,))
    assert p.ettr == pytest.approx(3600 / (3600 + 36 + 2 * 360))


def test_checkpoint_stall_from_rank_0s_summary_lines():
    lines = ["noise", "checkpoints mode=async saves=10 blocked_ms_per_save=2.5 "
             "write_ms_per_save=9.0 waited_for_previous=0 loop_s=1.0",
             "checkpoints mode=async saves=4 blocked_ms_per_save=5.0 write_ms_per_save=1.0 "
             "waited_for_previous=1 loop_s=2.0"]
    assert bd.checkpoint_stall(lines) == (pytest.approx(0.045), 14, 2)


def test_the_fault_intervals_the_goals_need():
    # elastic 60 s a fault: ETTR 0.9 at one fault every 540 s of work; the waiting policy
    # 240 s: 1.5x when (1 + 240/T) = 1.5 (1 + 60/T) -> T = 300 s, where elastic is 1/1.2
    for_ettr, for_ratio, ettr_there = bd.goal_rates([240.0], [60.0])
    assert for_ettr == pytest.approx(540.0) and for_ratio == pytest.approx(300.0)
    assert ettr_there == pytest.approx(1 / 1.2)
    assert bd.goal_rates([80.0], [60.0])[1:] == (None, None)  # 1.33x at most


def test_in_place_the_losses_idle_stretches_give_way_to_the_measured_pause():
    b = elastic_breakdown()  # the loss: 10 s idle, 4 s of the join, wall 50 s
    wall, ettr = bd.in_place_schedule(b, ["worker killed"], productive_s=20.0, step_s=0.5,
                                      lost_steps={0: 2}, again_s=5.0, join_s=0.1)
    assert wall == pytest.approx(50.0 - 14.0 - 1.0 + 5.1)
    assert ettr == pytest.approx(20.0 / wall)
    assert bd.in_place_schedule(b, ["rank hung"], productive_s=20.0, step_s=0.5,
                                lost_steps={}, again_s=5.0, join_s=0.1) == (50.0, 0.4)


def test_in_place_at_the_real_boot_a_loss_still_costs_the_missing_nodes_share():
    kinds = ["worker killed", "rank hung"]
    costs = bd.in_place_fault_cost(kinds, [84.0, 27.0], again_s=5.0, join_s=0.1,
                                   rejoin_s=4.0, boot_real=240.0, full_size=4,
                                   shrunk_size=3)
    assert costs == [pytest.approx(5.1 + 0.25 * 244.0), 27.0]
    spare = bd.in_place_fault_cost(kinds, [84.0, 27.0], again_s=5.0, join_s=0.1,
                                   rejoin_s=4.0, boot_real=240.0, full_size=4,
                                   shrunk_size=3, spare=True)
    assert spare == [pytest.approx(5.1), 27.0]


def test_a_replacement_registered_before_the_fault_was_not_waited_for():
    """A spare run: the previous loss's replacement registers while the job trains at full
    size, so it falls in the next fault's window before that fault; the job did not wait for
    it (the projection must not add the real boot to that fault). After the fault, it did."""
    spare = bd.Gap(100.0, 112.0, "worker killed #2", 1,
                   [("replacement registered", 88.7), ("fault injected", 100.2),
                    ("controller's record", 110.6)])
    assert not spare.waited
    waiting = bd.Gap(100.0, 134.8, "worker killed #1", 0,
                     [("fault injected", 100.0), ("controller's record", 110.5),
                      ("replacement registered", 120.1), ("attempt 2 started", 121.7)])
    assert waiting.waited
    assert not bd.Gap(100.0, 125.0, "rank hung #3", 2, [("fault injected", 99.9)]).waited

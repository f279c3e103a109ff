"""Hangs and stragglers, as tables: ``engine/hang_rules.py`` is pure."""

from __future__ import annotations

import pytest

from bootstrap_scripts.jobs.engine import hang_rules as hr
from bootstrap_scripts.jobs.engine.classify import Failure, FailureClass, FailureKind
from bootstrap_scripts.jobs.engine.restart_policy import Action, Policy, decide

T = 60.0  # the hang timeout of every row


@pytest.mark.parametrize(("steps", "moved_at", "now", "ranks", "expected"), [
    # nobody ever reported: a script without the progress API is never hung
    ({}, {}, 10_000.0, 4, None),
    # the newest move is recent: progress
    ({0: 5, 1: 5}, {0: 100.0, 1: 150.0}, 200.0, 2, None),
    # one rank still moves while the other is stuck: not (yet) a hang of the job
    ({0: 9, 1: 5}, {0: 195.0, 1: 10.0}, 200.0, 2, None),
    # exactly the timeout since the newest move: a hang, nobody behind
    ({0: 5, 1: 5}, {0: 100.0, 1: 140.0}, 200.0, 2, (60.0, 5, ())),
    # one rank at a lower step: behind
    ({0: 7, 1: 6, 2: 7}, {0: 10.0, 1: 9.0, 2: 10.0}, 100.0, 3, (90.0, 7, (1,))),
    # a rank that never reported is behind too
    ({0: 3, 2: 3}, {0: 0.0, 2: 0.0}, 61.0, 3, (61.0, 3, (1,))),
])
def test_judge_hang(steps, moved_at, now, ranks, expected) -> None:
    hang = hr.judge_hang(steps, moved_at, now=now, timeout=T, ranks=ranks)
    if expected is None:
        assert hang is None
    else:
        assert (hang.seconds, hang.top_step, hang.behind) == expected
        assert hang.last_progress_at == max(moved_at.values())


def test_no_timeout_never_judges() -> None:
    assert hr.judge_hang({0: 1}, {0: 0.0}, now=1e9, timeout=0, ranks=1) is None


SLEEP = "train.py:hang_here;train.py:main;train.py:<module>"
ALLREDUCE = ("distributed_c10d.py:all_reduce;c10d_logger.py:wrapper;train.py:main;"
             "train.py:<module>")
BACKWARD = "autograd/graph.py:_engine_run_backward;_tensor.py:backward;train.py:main"
LOADING = "train.py:load;train.py:main"


@pytest.mark.parametrize(("steps", "signatures", "odd"), [
    # everyone in the same collective at the same step: nobody odd (the gate decides)
    ({0: 4, 1: 4, 2: 4}, {0: ALLREDUCE, 1: ALLREDUCE, 2: ALLREDUCE}, ()),
    # the majority waits in the all-reduce, one rank sleeps: it is odd
    ({0: 4, 1: 4, 2: 4, 3: 4}, {0: ALLREDUCE, 1: ALLREDUCE, 2: SLEEP, 3: ALLREDUCE}, (2,)),
    # two ranks, no majority: the one outside a collective while the other waits
    ({0: 4, 1: 4}, {0: ALLREDUCE, 1: SLEEP}, (1,)),
    ({0: 4, 1: 4}, {0: SLEEP, 1: BACKWARD}, (0,)),
    # a lower step is odd whatever its stack
    ({0: 4, 1: 3, 2: 4}, {0: ALLREDUCE, 1: ALLREDUCE, 2: ALLREDUCE}, (1,)),
    # a rank that never reported is odd
    ({0: 4, 1: None}, {0: ALLREDUCE, 1: ALLREDUCE}, (1,)),
    # two different stacks, neither in a collective, same step: nobody can be named
    ({0: 4, 1: 4}, {0: SLEEP, 1: LOADING}, ()),
    # a rank whose stack could not be dumped is not odd for its (missing) stack
    ({0: 4, 1: 4, 2: 4}, {0: ALLREDUCE, 1: "", 2: ALLREDUCE}, ()),
    # no stacks at all: steps alone
    ({0: 4, 1: 2}, {}, (1,)),
])
def test_odd_ranks(steps, signatures, odd) -> None:
    assert hr.odd_ranks(steps, signatures) == odd


@pytest.mark.parametrize(("recent", "expected"), [
    # every rank alike: none
    ({0: (1.0,) * 6, 1: (1.1,) * 6, 2: (0.9,) * 6}, ()),
    # rank 2 at 2x the median of the others for 5 steps: a straggler
    ({0: (1.0,) * 6, 1: (1.0,) * 6, 2: (1.0, 2.0, 2.0, 2.0, 2.0, 2.0)}, ((2, 2.0),)),
    # only 4 slow steps so far: not yet (M = 5)
    ({0: (1.0,) * 6, 1: (1.0,) * 6, 2: (1.0, 1.0, 2.0, 2.0, 2.0, 2.0)}, ()),
    # one fast step among the last five: not a straggler
    ({0: (1.0,) * 6, 1: (1.0,) * 6, 2: (2.0, 2.0, 1.0, 2.0, 2.0, 2.0)}, ()),
    # exactly k x the median is not above it
    ({0: (1.0,) * 6, 1: (1.5,) * 6}, ()),
    # two ranks: each is compared with the other, only the slow one is named
    ({0: (1.0,) * 5, 1: (3.0,) * 5}, ((1, 3.0),)),
    # a rank alone has nobody to lag
    ({0: (9.0,) * 8}, ()),
    # a rank with too few steps is not judged, but still counts for the others' median
    ({0: (1.0,) * 5, 1: (1.0,), 2: (4.0,) * 5}, ((2, 4.0),)),
])
def test_stragglers(recent, expected) -> None:
    found = hr.stragglers(recent, factor=1.5, steps=5)
    assert tuple((s.rank, round(s.ratio, 3)) for s in found) == expected


def test_watchdog_env_lets_the_controller_act_first() -> None:
    assert hr.watchdog_env(0, "/x/rank_") == {}
    env = hr.watchdog_env(300, "/efs/jobs/j.1/flight/rank_")
    assert float(env["DL_COLLECTIVE_TIMEOUT"]) > 300  # torch's watchdog fires after ours
    assert float(env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) > float(env["DL_COLLECTIVE_TIMEOUT"])
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/efs/jobs/j.1/flight/rank_"


def test_a_hang_is_retried_like_a_node_fault_not_like_code() -> None:
    """``hang`` has its own class: restarted up to --max-restarts even with
    --max-code-restarts 0 (the default)."""
    hang = Failure(FailureKind.HANG, "no progress")
    assert hang.failure_class is FailureClass.HANG
    d = decide(hang, restarts=0, code_restarts=0, policy=Policy(max_restarts=2))
    assert d.action is Action.RESTART
    d = decide(hang, restarts=2, code_restarts=0, policy=Policy(max_restarts=2))
    assert d.action is Action.FAIL and "hang" in d.reason


def test_ranks_are_compared_on_their_compute_times_only_when_every_rank_gives_them() -> None:
    both = {0: ((1.0,), (0.4,)), 1: ((1.0,), (0.9,))}
    assert hr.comparable_step_times(both) == {0: (0.4,), 1: (0.9,)}
    one_without = {0: ((1.0,), (0.4,)), 1: ((1.0,), ())}
    assert hr.comparable_step_times(one_without) == {0: (1.0,), 1: (1.0,)}
    assert hr.comparable_step_times({}) == {}


def test_after_a_restart_start_up_is_a_hang_only_past_the_grace() -> None:
    grace = hr.RESTART_GRACE_FACTOR * T
    assert hr.judge_hang({}, {}, now=100 + grace - 1, timeout=T, ranks=2,
                         restarted_at=100) is None
    hang = hr.judge_hang({}, {}, now=100 + grace, timeout=T, ranks=2, restarted_at=100)
    assert hang is not None and hang.behind == (0, 1) and hang.last_progress_at == 100
    assert hr.judge_hang({}, {}, now=1e9, timeout=T, ranks=2) is None  # never restarted


@pytest.mark.parametrize(("grace", "cancel", "expected"), [
    (5.0, "hang: no progress on any rank for 10 s\n", hr.HANG_STOP_GRACE),  # stuck: 1 s
    (0.5, "hang: no progress\n", 0.5),  # a shorter --grace stays
    (5.0, "cancelled\n", 5.0),  # any other stop: the job's --grace to save
    (5.0, "", 5.0),
    (5.0, "a node failed 1 s ago (hang: in a message)\n", 5.0),  # only the controller's prefix
])
def test_a_hung_attempt_is_stopped_with_a_short_grace(grace, cancel, expected) -> None:
    assert hr.stop_grace(grace, cancel) == expected

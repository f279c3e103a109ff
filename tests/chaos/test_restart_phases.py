"""The restart breakdown's arithmetic (``restart_phases``) on hand-written log lines."""

from __future__ import annotations

import pytest

from tests.chaos import restart_phases as rp

LOSS = """\
WK 100.000 rank=0 out first_step rank=0 world_size=4 step=1
AG 110.500 n0 The node 'a' added itself to the wait list of round 1 of the rendezvous 'j'.
AG 110.900 n1 The node 'b' added itself to the wait list of round 1 of the rendezvous 'j'.
AG 113.000 n0 The node 'a' added itself to the participants of round 1 of the rendezvous 'j'.
AG 113.100 n1 The node 'b' added itself to the participants of round 1 of the rendezvous 'j'.
AG 115.000 n0 The node 'a' marked round 1 of the rendezvous 'j' as complete. Pending sync.
AG 115.100 n0 [default] Starting worker group
AG 115.900 n1 [default] Starting worker group
WK 117.000 rank=1 torch imported
WK 117.500 rank=0 torch imported
WK 117.600 rank=0 init_process_group done
WK 117.700 rank=1 init_process_group done
WK 119.000 rank=0 load_data done
WK 119.200 rank=1 load_data done
WK 121.000 rank=1 load_checkpoint done
WK 121.100 rank=0 load_checkpoint done
WK 121.150 rank=1 out first_step rank=1 world_size=3 step=9
WK 121.200 rank=0 out first_step rank=0 world_size=3 step=9
noise that is not a timed line
"""


def test_a_loss_is_split_at_each_phase_s_last_node():
    rows = dict(rp.phases(rp.events(LOSS.splitlines()), 110.0))
    assert rows["next round opens (workers exited, a dead node expired)"] == pytest.approx(3.0)
    assert rows["  of which: every live agent's workers exited"] == pytest.approx(0.9)
    assert rows["last call, round complete"] == pytest.approx(2.0)
    assert rows["every agent starts its workers"] == pytest.approx(0.9)
    assert rows["import torch"] == pytest.approx(1.6)
    assert rows["init_process_group (gloo)"] == pytest.approx(0.2)
    assert rows["the example's data"] == pytest.approx(1.5)
    assert rows["model, optimizer, checkpoint loaded"] == pytest.approx(1.9)
    assert rows["first step (rank 0)"] == pytest.approx(0.1)
    assert rp.total(rp.phases(rp.events(LOSS.splitlines()), 110.0)) == pytest.approx(11.2)


def test_a_restart_that_never_completed_is_an_error_not_a_figure():
    lines = [line for line in LOSS.splitlines() if "as complete" not in line]
    with pytest.raises(ValueError, match="last call"):
        rp.phases(rp.events(lines), 110.0)


def test_the_join_starts_when_an_agent_saw_the_node_waiting():
    lines = ["AG 50.0 n2 [default] Detected 1 new nodes from group_rank=2; will restart",
             "AG 50.2 n0 [default] Detected 1 new nodes from group_rank=0; will restart"]
    assert rp.seen_waiting(rp.events(lines), 40.0) == 50.0
    with pytest.raises(ValueError):
        rp.seen_waiting(rp.events(lines), 51.0)


CPU_MARKS = """\
WK 100.000 rank=0 load_checkpoint done cpu=9.000
WK 117.000 rank=1 torch imported cpu=1.500
WK 117.500 rank=0 torch imported cpu=2.500
WK 117.600 rank=0 init_process_group done cpu=2.600
WK 117.700 rank=1 init_process_group done cpu=1.700
WK 119.000 rank=0 load_data done cpu=2.610
WK 119.200 rank=1 load_data done cpu=2.700
WK 121.000 rank=1 load_checkpoint done cpu=3.700
WK 121.100 rank=0 load_checkpoint done cpu=4.610
WK 121.200 rank=0 out first_step rank=0 world_size=2 step=9 cpu=4.700
WK 130.000 rank=0 torch imported cpu=7.000
"""


def test_the_workers_cpu_seconds_per_start_up_phase_are_the_mean_over_ranks():
    rows = dict(rp.worker_cpu(rp.events(CPU_MARKS.splitlines()), 110.0))
    assert rows["import torch"] == pytest.approx(2.0)  # (2.5 + 1.5) / 2
    assert rows["init_process_group (gloo)"] == pytest.approx(0.15)
    assert rows["the example's data"] == pytest.approx(0.505)  # 0.01 and 1.0
    assert rows["model, optimizer, checkpoint loaded"] == pytest.approx(1.5)  # 2.0 and 1.0
    lines = [line for line in CPU_MARKS.splitlines() if "rank=1 load_data" not in line]
    with pytest.raises(ValueError, match="without every start-up mark"):
        rp.worker_cpu(rp.events(lines), 110.0)

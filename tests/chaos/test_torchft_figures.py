"""The torchft bench's arithmetic (``torchft_figures.py``) on hand-made event lines: pure,
fast, no torchft needed (the bench itself is ``test_torchft_bench.py``, ``make bench``)."""

from __future__ import annotations

from tests.chaos import torchft_figures as tf


def step(pid: int, t: float, n: int, *, ok: bool = True, world: int = 3, heal: bool = False,
         checksum: float = 1.0, replica: int = 0, q: float = 0.001, c: float = 0.0005,
         s: float = 0.003) -> dict:
    return {"event": "step", "pid": pid, "replica": replica, "t": t, "step": n,
            "committed": ok, "world": world, "healing": heal, "checksum": checksum,
            "quorum_s": q, "commit_s": c, "step_s": s}


def run() -> list[dict]:
    """Three replicas (pids 1-3) at steps 1..10 (t = step), pid 3 killed at 10.5; 1 and 2
    discard one attempt each, commit step 11 at 16 and 16.5 on 2 replicas, go on; pid 4
    replaces 3: started at 30 (spawned 29), ready 34, heals at step 25, takes part from
    step 26 (t 36) with the survivors' checksum."""
    ev = [step(p, float(n), n, checksum=float(n)) for p in (1, 2, 3) for n in range(1, 11)]
    ev += [step(1, 12.0, 10, ok=False, world=2), step(2, 12.1, 10, ok=False, world=2),
           step(1, 16.0, 11, world=2, checksum=11.0), step(2, 16.5, 11, world=2,
                                                           checksum=11.0)]
    ev += [step(p, 16.0 + n - 11, n, world=2, checksum=float(n)) for p in (1, 2)
           for n in range(12, 26)]
    ev += [{"event": "start", "pid": 4, "replica": 2, "t": 30.0},
           {"event": "ready", "pid": 4, "replica": 2, "t": 34.0},
           step(4, 35.0, 25, world=2, heal=True, checksum=25.0)]
    ev += [step(p, 36.0 + n - 26, n, world=3, checksum=float(n)) for p in (1, 2, 4)
           for n in range(26, 30)]
    return ev


def test_training_again_is_the_last_survivors_first_commit_after_the_kill():
    r = tf.recovery(run(), victim_pid=3, killed_at=10.5, full=3)
    assert r.again_s == 6.0  # pid 2's commit at 16.5, not pid 1's at 16.0
    assert r.discarded == 2
    assert r.lost_steps == 0  # they went on from step 11: nothing committed was undone


def test_a_survivor_that_never_commits_again_leaves_no_figure():
    ev = [e for e in run() if not (e.get("pid") == 2 and e["t"] > 10.5)]
    assert tf.recovery(ev, victim_pid=3, killed_at=10.5, full=3).again_s is None


def test_steps_lost_counts_committed_steps_done_again():
    ev = [e for e in run() if not (e["event"] == "step" and e["pid"] in (1, 2)
                                   and e["t"] > 10.5)]
    ev += [step(p, 20.0, 9, world=2) for p in (1, 2)]  # went on from step 9: 10 and 9 redone
    assert tf.recovery(ev, victim_pid=3, killed_at=10.5, full=3).lost_steps == 2


def test_rejoined_is_the_replacements_first_full_size_commit_and_its_weights_are_checked():
    r = tf.recovery(run(), victim_pid=3, killed_at=10.5, full=3, spawned_at=29.0,
                    replacement_pid=4)
    assert (r.start_s, r.import_s, r.rejoined_s) == (1.0, 4.0, 7.0)
    assert r.healed and r.weights_recovered
    assert r.join_step_s == 0.003  # the survivors' steps while it joined: none was longer


def test_the_join_costs_the_survivors_their_longest_step_while_it_joined():
    ev = run()
    for e in ev:
        if e["event"] == "step" and e["pid"] == 1 and e["step"] == 24:  # t 29: at the spawn
            e["step_s"] = 0.4  # the step in which it sent the replacement its state
    r = tf.recovery(ev, victim_pid=3, killed_at=10.5, full=3, spawned_at=29.0,
                    replacement_pid=4)
    assert r.join_step_s == 0.4


def test_weights_that_differ_from_the_survivors_are_reported():
    ev = [dict(e, checksum=99.0) if e.get("pid") == 4 and e["event"] == "step" else e
          for e in run()]
    r = tf.recovery(ev, victim_pid=3, killed_at=10.5, full=3, spawned_at=29.0,
                    replacement_pid=4)
    assert r.weights_recovered is False


def test_overhead_takes_full_size_steps_after_the_warmup_before_the_fault():
    ev = run()
    for e in ev:
        if e["event"] == "step" and e["step"] == 7:
            e["quorum_s"] = 5.0  # one slow quorum: the median ignores it
    o = tf.overhead(ev, full=3, until=10.5)
    assert o.steps == 3 * (10 - tf.WARMUP)
    assert (o.quorum_s, o.commit_s, o.step_s) == (0.001, 0.0005, 0.003)
    assert tf.overhead(ev, full=4) is None


def test_a_restart_trains_again_when_every_new_process_has_stepped():
    ev = [step(p, float(n), n) for p in (1, 2) for n in range(1, 5)]
    ev += [{"event": "start", "pid": p, "replica": 0, "t": 6.0} for p in (5, 6)]
    assert tf.restart_again(ev, killed_at=4.5) is None  # started, not stepped yet
    ev += [step(5, 12.0, 1), step(6, 13.5, 1)]
    assert tf.restart_again(ev, killed_at=4.5) == 9.0

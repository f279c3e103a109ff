"""``make demo ARGS="--elastic --kill-node-after S"``: the option combination, the job it runs
(``dl-run --elastic``), and the report line built from the workers' start lines (no cluster:
the drill on real nodes is ``make demo``; the controller's part is tests/jobs/test_rejoin.py)."""

from __future__ import annotations

import types

import pytest

from emulator.demo.context import DemoError
from emulator.demo.recovery import note_start, survivors_line
from tests.support.demo_args import job_argv, parsed


def test_elastic_and_kill_node_after_go_together_and_the_job_is_elastic(tmp_path, monkeypatch):
    ns = parsed("--elastic", "--kill-node-after", "1")
    assert ns.elastic and ns.kill_node_after == 1
    argv = job_argv(tmp_path, monkeypatch, "--elastic", "--kill-node-after", "1")
    assert "--elastic" in argv[:argv.index("--")]


@pytest.mark.parametrize(("args", "says"), [
    (("--elastic", "--kill-master-after", "1"), "separate scenarios"),
    (("--elastic", "--unhealthy-node"), "separate scenarios"),
    (("--elastic", "--kill-node-after", "1", "--add-worker-after", "5"), "separate scenarios"),
])
def test_what_the_elastic_drill_cannot_play_is_refused(args, says, capsys):
    with pytest.raises(SystemExit) as exc:
        parsed(*args)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_survivors_then_the_replacement_from_the_start_lines():
    kill = {"what": "worker", "t": 100.0}
    assert note_start(kill, 3, 3, 99.0) == ""  # before the kill: the first start
    assert note_start(kill, 2, 3, 111.5).startswith("training again on 2 survivors, 11.5 s")
    assert note_start(kill, 2, 3, 115.0) == ""  # another restart on the survivors
    assert note_start(kill, 3, 3, 136.25).startswith("the replacement joined")
    assert survivors_line(kill) == ("training again on 2 survivors after 11.5 s; replacement "
                                    "joined after 36.2 s")


def test_a_drill_that_did_not_happen_says_which_part():
    with pytest.raises(DemoError, match="never trained on the survivors"):
        survivors_line({"what": "worker", "t": 1.0})
    kill = {"what": "worker", "t": 1.0}
    note_start(kill, 2, 3, 5.0)
    with pytest.raises(DemoError, match="replacement never joined"):
        survivors_line(kill)
    assert note_start(None, 2, 3, 5.0) == ""


def test_the_sized_elastic_job_outlasts_the_kill_and_the_replacements_way_in(tmp_path):
    """Sized for 20 epochs the job ended before the replacement (47 s after the kill here)
    joined, and the demo failed; the demo now sizes it for the kill plus the replacement's
    budget and ends it by ``--stop-file`` once the replacement trained."""
    from emulator.demo import recovery, scenarios

    ns = parsed("--elastic", "--kill-node-after", "5", "--work-dir", str(tmp_path))
    pace = scenarios.min_epoch_seconds()
    assert ns.epochs * pace >= 5 + scenarios.REPLACEMENT_BUDGET_S + scenarios.TAIL_S
    ctx = types.SimpleNamespace(ns=ns, efs=tmp_path / "efs", membership=None, recovery={})
    drill = recovery.Recovery(ctx)
    assert drill.train_args() == ["--stop-file", str(tmp_path / "efs" / "demo" /
                                                     "scenario-done")]
    given = parsed("--elastic", "--kill-node-after", "5", "--epochs", "30")
    assert given.epochs == 30
    assert recovery.Recovery(types.SimpleNamespace(ns=given, efs=tmp_path, membership=None,
                                                   recovery={})).train_args() == []

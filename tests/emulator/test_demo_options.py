"""The demo's options checked before anything starts: ``--epochs 0`` refused, the accuracy
target of a short run said up front, and ``--context`` checked as ``cdk synth`` checks it
(exit 2 at once, with its "did you mean"), without Node's banner as Python bytes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from emulator.demo import scenarios
from tests.conftest import REPO_ROOT
from tests.support.demo_args import parsed

#: The environment of a new terminal: nothing quiets jsii's Node warnings beforehand.
QUIET_VARS = ("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION",
              "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION",
              "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION")


def fresh_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in QUIET_VARS}


def demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emulator.demo", *args], cwd=REPO_ROOT,
                          env=fresh_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [("--epochs", "0"), ("--epochs", "-1"),
                                  ("--elastic", "--epochs", "0")])
def test_no_epochs_is_refused_not_taken_for_the_default(args, capsys):
    with pytest.raises(SystemExit) as exc:
        parsed(*args)
    assert exc.value.code == 2
    assert f"--epochs must be >= 1, got {args[-1]}" in capsys.readouterr().err


def test_a_short_run_gets_a_target_it_can_reach_and_says_so():
    assert (parsed().require_acc, parsed().acc_note) == (scenarios.TARGET_ACC, "")
    short = parsed("--epochs", "3")
    assert short.require_acc == scenarios.SHORT_RUN_ACC < scenarios.TARGET_ACC
    assert short.acc_note.startswith("--epochs 3: the job must reach 0.80 held-out accuracy")
    given = parsed("--epochs", "3", "--require-acc", "0.9")
    assert (given.require_acc, given.acc_note) == (0.9, "")
    assert parsed("--epochs", str(scenarios.SHORT_RUN_EPOCHS)).require_acc == \
        scenarios.TARGET_ACC


def test_a_misspelt_context_key_is_refused_before_anything_starts():
    res = demo("--context", "workerCont=4")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "make demo: error: --context: unknown context key 'workerCont'; did you mean " \
           "'workerCount'?" in res.stderr
    assert "==>" not in res.stdout  # nothing started
    assert "b'!!" not in res.stderr and "end-of-life" not in res.stderr


def test_a_context_value_out_of_bounds_is_refused_with_the_demos_own_settings():
    res = demo("--workers", "3", "--context", "maxWorkers=2")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "'maxWorkers' must be at least workerCount + spotWorkers (3), got 2" in res.stderr


def test_reading_the_settings_prints_no_node_banner_as_bytes():
    """What ``dlc up``'s preflight imports first (a construct module), in a new terminal."""
    res = subprocess.run([sys.executable, "-c", "from dlc.preflight import parse_settings; "
                          "print(parse_settings(['workerCount=2']).worker_count)"],
                         cwd=REPO_ROOT, env=fresh_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "2"
    assert "b'!!" not in res.stderr and "end-of-life" not in res.stderr

"""The example's ``--stop-file``: a run ends at the epoch boundary after the file appears
(the elastic demo ends the job it sized this way once its scenario is done)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT


def run_example(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "bootstrap_scripts.examples.train_digits", "--epochs", "6",
         "--checkpoint-dir", str(tmp_path / "ck"), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_run_ends_after_the_epoch_in_which_the_stop_file_appeared(tmp_path):
    stop = tmp_path / "stop"
    stop.write_text("done\n")
    res = run_example(tmp_path, "--stop-file", str(stop))
    assert res.returncode == 0, res.stdout + res.stderr
    epochs = [ln for ln in res.stdout.splitlines() if ln.startswith("epoch=")]
    assert len(epochs) == 1 and epochs[0].startswith("epoch=1 "), res.stdout
    assert f"stop file {stop} exists: ending after epoch 1" in res.stdout
    assert "final acc=" in res.stdout


def test_a_stop_file_that_never_appears_changes_nothing(tmp_path):
    res = run_example(tmp_path, "--stop-file", str(tmp_path / "never"), "--epochs", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert [ln.split()[0] for ln in res.stdout.splitlines() if ln.startswith("epoch=")] == [
        "epoch=1", "epoch=2"]

"""``dl-run --env`` / ``--env-file``: the job's variables, and their values off dl-run's
command line (``bootstrap_scripts/jobs/cli/env_args.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bootstrap_scripts.jobs.cli import dl_run as runner
from bootstrap_scripts.jobs.cli import env_args, request_args
from bootstrap_scripts.jobs.engine.outcomes import RunError
from tests.conftest import REPO_ROOT


@pytest.fixture(autouse=True)
def no_carried(monkeypatch):
    monkeypatch.setattr(env_args, "_carried", None)
    monkeypatch.delenv(env_args.CARRIER, raising=False)


def test_hide_values_moves_every_value_and_keeps_the_rest():
    opts = ["--launcher", "each", "--env", "A=1", "--env=B=x=y", "--env", "C", "--name", "n"]
    assert env_args.hide_values(opts) == (
        ["--launcher", "each", "--env", "A", "--env", "B", "--env", "C", "--name", "n"],
        {"A": "1", "B": "x=y"})
    assert env_args.hide_values(["--env", "C", "--dry-run"]) is None


def test_env_key_takes_the_value_from_the_environment_or_the_carrier(monkeypatch):
    monkeypatch.setenv("DL_TEST_FROM_ENV", "from-env")
    monkeypatch.setenv(env_args.CARRIER, json.dumps({"DL_TEST_CARRIED": "carried"}))
    assert env_args.given_env(["DL_TEST_FROM_ENV", "DL_TEST_CARRIED", "X=1"], []) == {
        "DL_TEST_FROM_ENV": "from-env", "DL_TEST_CARRIED": "carried", "X": "1"}
    assert env_args.CARRIER not in os.environ  # taken out: no child inherits it


def test_env_file_lines_comments_and_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("DL_TEST_FROM_ENV", "e")
    f = tmp_path / "job.env"
    f.write_text("# secrets\n\nDB_PASSWORD=p=w d\nDL_TEST_FROM_ENV\nA=file\n")
    assert env_args.given_env(["A=option"], [str(f)]) == {
        "DB_PASSWORD": "p=w d", "DL_TEST_FROM_ENV": "e", "A": "option"}
    f.write_text("=nokey\n")
    with pytest.raises(RunError, match="line 1"):
        env_args.given_env([], [str(f)])
    with pytest.raises(RunError, match="--env-file"):
        env_args.given_env([], [str(tmp_path / "missing.env")])


def test_env_file_keys_are_forwarded_like_env_keys(tmp_path):
    f = tmp_path / "job.env"
    f.write_text("SECRET=s\n")
    args = runner.build_parser().parse_args(["--env-file", str(f), "--env", "A=1"])
    req = request_args.request_from_args(args, ["true"], "j1")
    assert req.env["SECRET"] == "s" and req.env["A"] == "1"
    assert {"SECRET", "A"} <= set(req.forward)


#: dl-run as a program: the options parsed, the job's variables printed, its own cmdline
#: printed (after the re-exec, if any), nothing run
SHOW = """
import json, sys
from bootstrap_scripts.jobs.cli import dl_run
def show(argv):
    opts, cmd = dl_run.split_command(argv)
    args = dl_run.build_parser().parse_args(opts)
    env = dl_run.request_from_args(args, cmd, "j1").env
    cmdline = open("/proc/self/cmdline", "rb").read().split(b"\\0")
    print(json.dumps({"env": env, "cmdline": [c.decode() for c in cmdline if c]}))
    return 0
dl_run.run = show
sys.exit(dl_run.main())
"""


def test_a_value_given_on_the_command_line_leaves_it_at_once(tmp_path):
    """``dl-run --env SECRET=value`` runs itself again, in the same process, with the
    value in its environment: its ``/proc/<pid>/cmdline`` (every user's to read) holds
    the name only, and the job still gets the value. Fails if dl-run keeps its argv."""
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    value = "s3cret-value-123"
    proc = subprocess.run([sys.executable, str(script), "--launcher", "each", "--env",
                           f"DL_SECRET={value}", "--env=OTHER=2", "--", "echo", "--env", "X=1"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["env"]["DL_SECRET"] == value and shown["env"]["OTHER"] == "2"
    assert not any(value in part for part in shown["cmdline"]), shown["cmdline"]
    # the command's own words are the command's: untouched
    assert shown["cmdline"][-4:] == ["--", "echo", "--env", "X=1"]
    assert env_args.CARRIER not in shown["env"]

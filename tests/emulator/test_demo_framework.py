"""``make demo ARGS="--framework tf"``: the option, its validation, the job it runs and the
TensorFlow install it triggers (no cluster: the job's command line is what is checked; the
TF job on real emulated nodes is tests/runner/test_tensorflow.py)."""

from __future__ import annotations

import sys
import types

import pytest

from emulator.demo import frameworks
from emulator.demo.context import DemoError
from tests.support.demo_args import job_argv, parsed


def test_framework_defaults_to_torch_and_takes_tf():
    assert parsed().framework == "torch"
    assert parsed("--framework", "tf").framework == "tf"


@pytest.mark.parametrize("args", [("--framework", "mxnet"),
                                  ("--framework", "tf", "--elastic"),
                                  ("--framework", "tf", "--kill-node-after", "5"),
                                  ("--framework", "tf", "--kill-master-after", "0"),
                                  ("--framework", "tf", "--unhealthy-node")])
def test_what_tf_cannot_play_is_refused_before_anything_starts(args, capsys):
    with pytest.raises(SystemExit) as exc:
        parsed(*args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--framework" in err, err




def test_tf_runs_the_tf_example_with_the_tf_launcher_as_on_aws(tmp_path, monkeypatch):
    """The job's command line is AWS's: the nodes' own wildcard binds are the emulated
    nodes' (their executors'), never an option of the demo's job."""
    argv = job_argv(tmp_path, monkeypatch, "--framework", "tf", "--epochs", "3")
    sep = argv.index("--")
    options, command = argv[:sep], argv[sep + 1:]
    assert options[options.index("--launcher") + 1] == "tf"
    assert options[options.index("--tf-port") + 1].isdigit()
    assert "--rdzv-port" not in options
    assert not any("LD_PRELOAD" in o for o in options) and "--env" not in options
    assert command[:3] == ["python", "-m", "bootstrap_scripts.examples.train_digits_tf"]
    assert command[command.index("--epochs") + 1] == "3"


def test_torch_is_unchanged(tmp_path, monkeypatch):
    argv = job_argv(tmp_path, monkeypatch)
    options, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    assert "--launcher" not in options and "--rdzv-port" in options
    assert "--env" not in options
    assert command[:3] == ["python", "-m", "bootstrap_scripts.examples.train_digits"]


def test_tensorflow_is_installed_by_the_script_only_when_missing(monkeypatch):
    ctx = types.SimpleNamespace(step=lambda _t: None, ok=lambda _t: None)
    calls: list[list[str]] = []
    exit_code = {"rc": 0}

    def run(argv, **_kw):
        calls.append(argv)
        return types.SimpleNamespace(returncode=exit_code["rc"])

    monkeypatch.setattr(frameworks.subprocess, "run", run)
    monkeypatch.setattr(frameworks.importlib.util, "find_spec", lambda _name: object())
    frameworks.ensure_tensorflow(ctx)
    assert calls == []  # present: nothing installed

    monkeypatch.setattr(frameworks.importlib.util, "find_spec", lambda _name: None)
    frameworks.ensure_tensorflow(ctx)
    assert calls == [["bash", str(frameworks.TF_DEPS), sys.executable]]
    exit_code["rc"] = 1
    with pytest.raises(DemoError, match="installing TensorFlow failed"):
        frameworks.ensure_tensorflow(ctx)

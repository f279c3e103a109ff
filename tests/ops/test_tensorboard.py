"""TensorBoard for a job: who it runs as, where it listens, what it reads (unit tests; the
real run in a browser is tests/ops/test_tensorboard_browser.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootstrap_scripts import tensorboard_log
from bootstrap_scripts.jobs.cli import dl_jobs
from bootstrap_scripts.jobs.controller.attempts import attempt_request
from bootstrap_scripts.ops import tensorboard_server as tb
from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.support.attempt_request import request


@pytest.mark.parametrize(("owner", "euid", "expected"), [
    (1500, 0, 1500),       # root (the operator channel) starts it as the job's user
    (1500, 1500, 1500),    # a user, for their own job
    (0, 0, None),          # a root-owned job: never as root
    (999, 0, None),        # a system user's: never
    (1500, 1600, None),    # another user's job: not yours
])
def test_tensorboard_runs_as_the_jobs_user_never_root(owner, euid, expected):
    if expected is None:
        with pytest.raises(tb.TensorBoardError):
            tb.run_as(owner, euid)
    else:
        assert tb.run_as(owner, euid) == expected


def test_the_server_listens_on_loopback_only_and_reads_only_the_jobs_directory():
    argv = tb.server_argv(Path("/efs/managed/j1/tensorboard"), 6007, 30)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--logdir") + 1] == "/efs/managed/j1/tensorboard"
    assert argv[argv.index("--port") + 1] == "6007"
    assert argv[:3] == ["timeout", "--kill-after=10", "30m"]  # it ends by itself
    assert not any("prefix" in a for a in argv)  # the secret never on a public command line


def test_every_start_gets_a_new_secret_path_the_runner_accepts():
    from bootstrap_scripts.ops import tensorboard_run

    first, second = tb.new_prefix(), tb.new_prefix()
    assert first != second and len(first) == 33
    assert tensorboard_run.read_prefix(first + "\n") == first


@pytest.mark.parametrize("line", ["", "\n", "/", "/short", "/" + "a" * 32 + "/",
                                  "/" + "a" * 31, "/../" + "a" * 32, "a" * 33])
def test_the_runner_refuses_to_serve_without_a_secret(line):
    """TensorBoard with no (or a guessable) prefix would serve every path to every user."""
    from bootstrap_scripts.ops import tensorboard_run

    with pytest.raises(ValueError, match="no valid secret"):
        tensorboard_run.read_prefix(line)


def test_a_taken_port_is_skipped():
    assert tb.pick_port(6006, free=lambda p: p >= 6008) == 6008
    with pytest.raises(tb.TensorBoardError, match="no free port"):
        tb.pick_port(6006, free=lambda p: False)


def test_the_controller_points_every_attempt_at_the_jobs_own_directory():
    run = attempt_request(request(), attempt_id="train-1.2", efs=Path("/efs"),
                          restart_count=1, user="ann")
    assert run.env[tensorboard_log.DIR_ENV] == "/efs/managed/ann/train-1/tensorboard"
    assert tensorboard_log.DIR_ENV in run.forward


def test_a_request_json_that_is_a_link_is_refused(tmp_path: Path):
    paths = ClusterPaths(tmp_path).managed("j1")
    paths.dir.mkdir(parents=True)
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", paths.request)
    with pytest.raises(tb.TensorBoardError, match="symbolic link"):
        tb.job_owner(paths)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a root-owned job (CI runs as root)")
def test_dl_jobs_tensorboard_refuses_a_root_owned_job(tmp_path: Path, capsys):
    paths = ClusterPaths(tmp_path).managed("j1")
    (paths.tensorboard_dir).mkdir(parents=True)
    paths.request.write_text("{}")  # root's: TensorBoard would run as root
    code = dl_jobs.main(["--mount-point", str(tmp_path), "tensorboard", "j1"])
    err = capsys.readouterr().err
    assert code == dl_jobs.EXIT_FAILED and "never as root" in err, err


def test_the_writer_is_rank_zeros_and_only_with_a_directory(monkeypatch, tmp_path: Path):
    monkeypatch.delenv(tensorboard_log.DIR_ENV, raising=False)
    monkeypatch.setenv("RANK", "0")
    assert tensorboard_log.open_writer() is None  # no directory: nothing written
    monkeypatch.setenv(tensorboard_log.DIR_ENV, str(tmp_path / "tb"))
    monkeypatch.setenv("RANK", "1")
    assert tensorboard_log.open_writer() is None  # another rank
    assert not (tmp_path / "tb").exists()
    tensorboard_log.scalars(None, 1, loss=1.0)  # a no-op without a writer
    tensorboard_log.close(None)


def test_the_nodes_install_the_tensorboard_the_requirements_pin() -> None:
    from constructs_lib.user_data import TENSORBOARD_REQUIREMENT
    from tests.conftest import REPO_ROOT

    pins = (Path(REPO_ROOT) / "requirements.txt").read_text().split()
    assert TENSORBOARD_REQUIREMENT in pins

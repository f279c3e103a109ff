"""The share wrapper's start (``executor/share_command.py``, ``share_wrapper.py``): root's
allowlisted environment for the wrapper, the job's argv, environment and directory for its
child only, and why a command could not start, reported before the share counts as running.

Real processes, no cluster: the wrapper keeps the executor's uid here (-1), which is what a
job of root's own gets; the drill with a real user is tests/security/test_root_env.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine.root_env import root_env
from bootstrap_scripts.jobs.executor.share_command import Launch, exec_errors, start_wrapped

TOKEN = "alice/j1/0/127.0.0.1"


def launch(tmp_path: Path, *argv: str, env: dict[str, str] | None = None,
           cwd: str = "") -> Launch:
    return Launch(status=tmp_path / "share.status", uid=-1, gid=-1, cwd=cwd or str(tmp_path),
                  fallback="/", argv=argv, env={"PATH": "/usr/bin:/bin", **(env or {})})


def run(tmp_path: Path, spec: Launch) -> tuple[subprocess.Popen, str, str]:
    """(the wrapper, its start error, the log once it ended)."""
    log_path = tmp_path / "share.log"
    with open(log_path, "ab") as log:
        popen, report = start_wrapped(spec, TOKEN, log, 0)
    (error,) = exec_errors([report])
    popen.wait(timeout=60)
    return popen, error, log_path.read_text()


def environ(pid: int) -> dict[str, str]:
    data = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(e.split("=", 1) for e in data.decode().split("\0") if e)


def test_the_wrapper_gets_roots_allowlist_and_no_job_argv_the_child_gets_the_job(tmp_path):
    marker = tmp_path / "go"
    spec = launch(tmp_path, "/bin/sh", "-c", f"while [ ! -e {marker} ]; do sleep 0.05; done",
                  "job-argv-word", env={"LD_PRELOAD": "", "JOB_ONLY": "job-env-value"})
    log_path = tmp_path / "share.log"
    with open(log_path, "ab") as log:
        popen, report = start_wrapped(spec, TOKEN, log, 0)
    (error,) = exec_errors([report])
    try:
        assert error == ""
        assert environ(popen.pid) == root_env(DL_SHARE_TOKEN=TOKEN)
        wrapper_argv = Path(f"/proc/{popen.pid}/cmdline").read_bytes()
        assert b"job-argv-word" not in wrapper_argv and b"job-env-value" not in wrapper_argv
        children = Path(f"/proc/{popen.pid}/task/{popen.pid}/children").read_text().split()
        (child,) = children
        assert environ(int(child))["JOB_ONLY"] == "job-env-value"
        assert Path(f"/proc/{child}/cwd").resolve() == tmp_path.resolve()
    finally:
        marker.touch()
        popen.wait(timeout=60)
    assert popen.returncode == 0
    assert json.loads(spec.status.read_text())["returncode"] == 0


@pytest.mark.parametrize(("argv0", "why"), [("dl-no-such-command", "not found in PATH"),
                                            ("./dl-no-such-file", "no such executable file")])
def test_a_command_that_cannot_start_is_reported_at_once(tmp_path, argv0, why):
    popen, error, log = run(tmp_path, launch(tmp_path, argv0))
    assert error == f"cannot start {argv0!r}: {why}"
    assert popen.returncode == 127 and error in log


def test_the_command_is_looked_up_in_the_jobs_path_and_a_missing_cwd_falls_back(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "dl-job-tool"
    tool.write_text("#!/bin/sh\npwd\n")
    tool.chmod(0o755)
    spec = launch(tmp_path, "dl-job-tool", env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
                  cwd=str(tmp_path / "gone"))
    popen, error, log = run(tmp_path, spec)
    assert (error, popen.returncode, log.strip()) == ("", 0, "/")


def test_root_env_refuses_any_other_name():
    with pytest.raises(ValueError, match="LD_PRELOAD"):
        root_env(LD_PRELOAD="/tmp/x.so")
    assert set(root_env()) == {"PATH", "LANG", "LC_ALL"}
    assert os.pathsep + "." not in root_env()["PATH"]


def test_a_variable_no_environment_can_hold_fails_the_start_not_the_executor(tmp_path):
    """A job's spec is its user's file: a variable name with ``=`` reaches only the
    wrapper's child, which reports it; before, ``Popen`` raised in the executor itself."""
    popen, error, _log = run(tmp_path, launch(tmp_path, "/bin/true", env={"A=B": "1"}))
    assert popen.returncode == 127 and "illegal environment variable name" in error

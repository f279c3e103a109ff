"""``dl-container run``: root refuses; a real user's rank becomes its rootless podman argv.

podman itself is played by a script on the user's PATH that prints the argv it was given:
what is checked here is the command line and who runs it, not a container (docs/containers.md
says what is not proven yet).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from bootstrap_scripts.containers import run
from emulator.nodes import PYTHON
from tests.conftest import REPO_ROOT
from tests.support.users import CAN_CREATE_USERS, job_user, login_env, reachable_python

__all__ = ["job_user", "reachable_python"]  # fixtures, used by name

DIGEST = "sha256:" + "cd" * 32
IMAGE = f"127.0.0.1:5000/team/train:v1@{DIGEST}"
FAKE_PODMAN = """#!/bin/sh
exec {python} -c 'import json, os, sys; print(json.dumps({{"argv": sys.argv[1:], \
"uid": os.getuid(), "env": {{k: os.environ.get(k) for k in ("RANK", "AWS_SECRET_ACCESS_KEY")}}\
}}))' "$@"
"""


def test_mounts_keep_existing_outermost_directories():
    existing = {"/mnt/efs", "/mnt/efs/jobs/alice/1", "/data", "/home/alice/.aws-job"}
    env = {"EFS_MOUNT": "/mnt/efs", "DL_JOB_DIR": "/mnt/efs/jobs/alice/1",
           "DL_DATA_DIR": "/data", "DL_CHECKPOINT_DIR": "/missing",
           "AWS_CONFIG_FILE": "/home/alice/.aws-job/config"}
    assert run.mounts(env, "/mnt/efs/jobs/alice/1", existing.__contains__) == (
        "/data", "/mnt/efs", "/home/alice/.aws-job")
    assert run.mounts({"DL_DATA_DIR": "relative"}, "/", lambda p: True) == ("/",)


def test_gpus_go_in_only_where_the_cdi_specification_is():
    env = {"RANK": "0"}
    with_gpus = run.rank_container(IMAGE, ["python"], env, "/w", is_dir=lambda p: False,
                                   exists=lambda p: p == run.CDI_SPECS[0])
    without = run.rank_container(IMAGE, ["python"], env, "/w", is_dir=lambda p: False,
                                 exists=lambda p: False, efa=["/dev/infiniband/uverbs0"])
    assert with_gpus.gpus and not without.gpus
    assert without.devices == ("/dev/infiniband/uverbs0",)


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is root's")
def test_root_is_refused(capsys):
    assert run.main(["run", IMAGE, "--", "python", "train.py"]) == run.EXIT_REFUSED
    assert "refusing to run as root" in capsys.readouterr().err


@pytest.mark.skipif(not CAN_CREATE_USERS, reason="needs root to create a user")
def test_a_user_runs_podman_as_itself_with_the_ranks_argv(job_user, reachable_python):
    bin_dir = Path(tempfile.mkdtemp(prefix="dl-container-test-"))
    try:
        bin_dir.chmod(0o755)
        podman = bin_dir / "podman"
        podman.write_text(FAKE_PODMAN.format(python=PYTHON))
        podman.chmod(0o755)
        env = {**login_env(job_user), "PATH": f"{bin_dir}:/usr/bin:/bin", "RANK": "3",
               "AWS_SECRET_ACCESS_KEY": "never-inside", "DL_JOB_DIR": str(bin_dir)}
        done = subprocess.run(
            [PYTHON, "-m", "bootstrap_scripts.containers.run", "run", IMAGE, "--",
             "python", "train.py", "--lr", "0.1"],
            cwd=REPO_ROOT, env=env, user=job_user.pw_uid, group=job_user.pw_gid,
            extra_groups=[], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["uid"] == job_user.pw_uid
        argv = seen["argv"]
        assert argv[0] == "run"
        assert argv[argv.index(f"127.0.0.1:5000/team/train@{DIGEST}") + 1:] == [
            "python", "train.py", "--lr", "0.1"]
        assert "--env=RANK" in argv and "--userns=keep-id" in argv
        assert f"--volume={bin_dir}:{bin_dir}" in argv
        assert not any("AWS_SECRET_ACCESS_KEY" in a for a in argv)
        # the value travels in podman's environment, never in its argv
        assert seen["env"]["RANK"] == "3"
    finally:
        shutil.rmtree(bin_dir)


def test_an_unpinned_or_malformed_image_is_refused_before_podman(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "execvp", lambda *a: pytest.fail("podman started"))
    assert run.main(["run", "127.0.0.1:5000/team/train:v1", "--", "true"]) == 2
    assert "not pinned" in capsys.readouterr().err
    assert run.main(["run", "127.0.0.1:5000/Team/train@" + DIGEST, "--", "true"]) == 2
    assert "'Team'" in capsys.readouterr().err


def test_pull_refuses_an_unpinned_image_and_root_before_podman(monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("podman started"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert run.main(["pull", f"127.0.0.1:5000/team/train@{DIGEST}"]) == run.EXIT_REFUSED
    assert "refusing to run as root" in capsys.readouterr().err
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert run.main(["pull", "127.0.0.1:5000/team/train:v1"]) == run.EXIT_REFUSED
    assert "not pinned" in capsys.readouterr().err

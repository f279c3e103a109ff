"""install.py writes the systemd units and wrappers; ExecStart round-trips the arguments."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from bootstrap_scripts.agent import cloudwatch_config, install
from bootstrap_scripts.agent.settings import build_parser

HANDLE = ("https://cloudformation-waitcondition-us-east-1.s3.amazonaws.com/arn%3Aaws%3A"
          "cloudformation%3Aus-east-1%3A1234%3Astack/s/x?X-Amz-Signature=a%2Fb&X-Amz-Date=1")


def agent_args(root) -> list[str]:
    return ["--role", "worker", "--cluster-id", "dlc", "--stack-name", "dlc", "--region",
            "us-east-1", "--master-queue-url", "https://sqs/q-master",
            "--efs-id", "fs-0123abcd", "--mount-point", "/efs",
            "--wait-handle", HANDLE, "--setup-timeout", "3300", "--root", str(root)]


def exec_start_argv(unit: str) -> list[str]:
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    text = line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$")
    return shlex.split(text)


def test_units_and_wrappers_are_written(tmp_path):
    written = install.install([*agent_args(tmp_path), "--no-systemctl",
                               "--python", "/usr/bin/python3", "--package-dir", "/opt/dl"])
    # a worker: the region file and its login-shell snippet, the agent and executor units
    # (no job controller: the master's only), the log files' rotation, dl-run's default
    # --data-checksums (tests/data/test_checksums_default.py), the images dl-run --image
    # accepts (tests/containers/test_allowed_images_node.py) and every wrapper (no
    # CloudWatch agent configuration without --log-group)
    assert len(written) == 2 + 2 + 1 + 1 + 1 + len(install.WRAPPERS)
    assert not (tmp_path / cloudwatch_config.CONFIG_PATH).exists()
    assert not (tmp_path / "etc/systemd/system/dl-controller.service").exists()
    unit = (tmp_path / "etc/systemd/system/dl-agent.service").read_text()
    argv = exec_start_argv(unit)
    assert argv[:3] == ["/usr/bin/python3", "-m", "bootstrap_scripts.agent.node_agent"]
    ns = build_parser().parse_args(argv[3:])
    assert ns.wait_handle == HANDLE
    assert (ns.role, ns.efs_id, ns.mount_point, ns.root) == ("worker", "fs-0123abcd", "/efs",
                                                            str(tmp_path))
    assert "RestartPreventExitStatus=2 64" in unit
    executor = (tmp_path / "etc/systemd/system/dl-executor.service").read_text()
    assert exec_start_argv(executor) == ["/usr/bin/python3", "-m",
                                         "bootstrap_scripts.jobs.executor",
                                         "--root", str(tmp_path), "--mount-point", "/efs",
                                         "--guard-imds"]
    for name in ("dl-run", "dl-jobs", "dl-health", "dl-agent", "dl-scale", "dl-container"):
        wrapper = tmp_path / "usr/local/bin" / name
        assert wrapper.stat().st_mode & 0o111
        assert "PYTHONPATH='/opt/dl'" in wrapper.read_text()


def test_empty_wait_handle_survives_the_unit(tmp_path):
    args = agent_args(tmp_path)
    args[args.index("--wait-handle") + 1] = ""
    install.install([*args, "--no-systemctl"])
    unit = (tmp_path / "etc/systemd/system/dl-agent.service").read_text()
    assert build_parser().parse_args(exec_start_argv(unit)[3:]).wait_handle == ""


def test_install_is_idempotent(tmp_path):
    install.install([*agent_args(tmp_path), "--no-systemctl"])
    unit = tmp_path / "etc/systemd/system/dl-agent.service"
    before = unit.stat().st_mtime_ns
    install.install([*agent_args(tmp_path), "--no-systemctl"])
    assert unit.stat().st_mtime_ns == before


def test_bad_agent_arguments_fail_the_install(tmp_path):
    args = agent_args(tmp_path)
    args[args.index("--role") + 1] = "boss"
    with pytest.raises(SystemExit):
        install.install([*args, "--no-systemctl"])
    assert not (tmp_path / "etc").exists()


def test_wrapper_runs_the_module(tmp_path):
    from tests.conftest import REPO_ROOT

    install.install([*agent_args(tmp_path), "--no-systemctl", "--python", sys.executable,
                     "--package-dir", REPO_ROOT])
    out = subprocess.run([str(tmp_path / "usr/local/bin/dl-agent"), "--help"],
                         capture_output=True, text=True, check=True)
    assert "--cluster-id" in out.stdout

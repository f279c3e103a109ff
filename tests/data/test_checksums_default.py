"""The cluster's default ``--data-checksums`` (the stack's ``dataChecksums``) on a node.

The user data gives the installer ``--data-checksums``; the installer writes it under the
node's root (``data.checksums.SETTING_FILE``); ``dl-run --data`` without the flag takes it
from there, an explicit flag wins, and a node without the file (installed before the
setting) keeps ``warn``. The stack's side: tests/stack/test_settings.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bootstrap_scripts.agent import install
from bootstrap_scripts.data import checksums
from bootstrap_scripts.jobs.cli.dl_run import build_parser, split_command
from bootstrap_scripts.jobs.cli.request_args import request_from_args
from bootstrap_scripts.protocol.run_request import RunRequest
from emulator.deploy import REPO_ROOT


def installed_node(root: Path, monkeypatch, *extra: str) -> Path:
    """A worker's root as the real installer leaves it (no systemctl, no metadata)."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    install.install(["--role", "worker", "--cluster-id", "dlc", "--stack-name", "dlc",
                     "--region", "us-east-1", "--efs-id", "fs-0123abcd", "--mount-point",
                     "/efs", "--wait-handle", "", "--root", str(root), "--no-systemctl",
                     "--python", sys.executable, "--package-dir", str(REPO_ROOT), *extra])
    return root


def request(root: Path, *argv: str) -> RunRequest:
    """What ``dl-run --root ROOT ARGV -- python train.py`` asks for (its parser and rules)."""
    opts, command = split_command(["--root", str(root), *argv, "--", "python", "train.py"])
    return request_from_args(build_parser().parse_args(opts), command, "j-1")


def test_the_clusters_default_reaches_dl_run_and_an_explicit_flag_wins(tmp_path, monkeypatch):
    root = installed_node(tmp_path / "node", monkeypatch, "--data-checksums", "required")
    assert checksums.node_default(root) == checksums.REQUIRED
    assert request(root, "--data", "s3://b-1/ds").data_checksums == "required"
    assert request(root, "--data", "s3://b-1/ds",
                   "--data-checksums", "warn").data_checksums == "warn"
    # a job without --data stages nothing: the default neither applies nor refuses it
    assert request(root).data_checksums == "warn"


def test_the_installer_writes_warn_by_default_and_refuses_a_bad_mode(tmp_path, monkeypatch,
                                                                     capsys):
    root = installed_node(tmp_path / "node", monkeypatch)
    assert (root / checksums.SETTING_FILE).read_text() == "warn\n"
    assert request(root, "--data", "s3://b-1/ds").data_checksums == "warn"
    with pytest.raises(SystemExit) as exit_:
        installed_node(tmp_path / "bad", monkeypatch, "--data-checksums", "strict")
    assert exit_.value.code == 2
    assert "--data-checksums: invalid choice: 'strict'" in capsys.readouterr().err
    assert not (tmp_path / "bad" / checksums.SETTING_FILE).exists()


def test_a_node_without_the_setting_keeps_warn(tmp_path):
    """An older node (or one whose file is not the installer's): ``warn``, as before."""
    assert checksums.node_default(tmp_path) == checksums.WARN
    assert request(tmp_path, "--data", "s3://b-1/ds").data_checksums == "warn"
    setting = tmp_path / checksums.SETTING_FILE
    setting.parent.mkdir(parents=True)
    planted = tmp_path / "planted"
    planted.write_text("required\n")
    setting.symlink_to(planted)  # a link is never followed
    assert checksums.node_default(tmp_path) == checksums.WARN
    setting.unlink()
    setting.write_text("strict\n")  # not a mode
    assert checksums.node_default(tmp_path) == checksums.WARN

"""The stack's ``allowedImages`` on a node: the installer writes it, ``dl-run --image``
refuses a repository outside it naming the repository and the setting, and a node without
the list (or with an empty one) runs no image."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bootstrap_scripts.agent import install
from bootstrap_scripts.containers import allow
from bootstrap_scripts.jobs.cli.dl_run import build_parser, split_command
from bootstrap_scripts.jobs.cli.request_args import request_from_args
from bootstrap_scripts.jobs.engine.outcomes import RunError
from bootstrap_scripts.protocol.run_request import RunRequest
from emulator.deploy import REPO_ROOT

ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
DIGEST = "sha256:" + "1f" * 32


def installed_node(root: Path, monkeypatch, *extra: str) -> Path:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    install.install(["--role", "worker", "--cluster-id", "dlc", "--stack-name", "dlc",
                     "--region", "us-east-1", "--efs-id", "fs-0123abcd", "--mount-point",
                     "/efs", "--wait-handle", "", "--root", str(root), "--no-systemctl",
                     "--python", sys.executable, "--package-dir", str(REPO_ROOT), *extra])
    return root


def request(root: Path, *argv: str) -> RunRequest:
    opts, command = split_command(["--root", str(root), *argv, "--", "python", "train.py"])
    return request_from_args(build_parser().parse_args(opts), command, "j-1")


def test_dl_run_takes_an_allowed_image_and_refuses_others_naming_them(tmp_path, monkeypatch):
    root = installed_node(tmp_path / "node", monkeypatch, "--allowed-images",
                          f"{ECR}/team, nvcr.io/nvidia/pytorch")
    assert (root / allow.SETTING_FILE).read_text() == f"{ECR}/team\nnvcr.io/nvidia/pytorch\n"
    assert allow.node_entries(root) == (f"{ECR}/team", "nvcr.io/nvidia/pytorch")
    image = f"{ECR}/team/train:v3@{DIGEST}"
    assert request(root, "--image", image).image == image
    # a tag outside the list is refused before any registry is asked to resolve it
    # (nvcr.io is out of reach here: resolving first would fail on the network instead)
    for refused in (f"{ECR}/teamx/train@{DIGEST}", f"nvcr.io/nvidia/tensorflow@{DIGEST}",
                    "nvcr.io/nvidia/tensorflow:24.05-tf2-py3"):
        with pytest.raises(RunError) as caught:
            request(root, "--image", refused)
        assert refused.split("@")[0].rsplit(":", 1)[0] in str(caught.value)
        assert "allowedImages" in str(caught.value)


def test_without_the_setting_a_node_runs_no_image(tmp_path, monkeypatch):
    root = installed_node(tmp_path / "node", monkeypatch)
    assert (root / allow.SETTING_FILE).read_text() == ""
    with pytest.raises(RunError, match="allowedImages setting is empty"):
        request(root, "--image", f"nvcr.io/nvidia/pytorch@{DIGEST}")
    assert allow.node_entries(tmp_path / "never-installed") == ()
    assert request(root).image == ""  # a job without an image is not concerned


def test_the_installer_refuses_an_entry_that_could_never_match(tmp_path, monkeypatch):
    with pytest.raises((SystemExit, ValueError)):
        installed_node(tmp_path / "bad", monkeypatch, "--allowed-images",
                       "https://nvcr.io/nvidia")
    assert not (tmp_path / "bad" / allow.SETTING_FILE).exists()
    with pytest.raises(ValueError, match=r"'nvcr\.io/NVIDIA'"):
        allow.check_entries(["nvcr.io/NVIDIA"])
    assert allow.check_entries([ECR, f"{ECR}/team", "localhost:5000/a/b"]) == (
        ECR, f"{ECR}/team", "localhost:5000/a/b")

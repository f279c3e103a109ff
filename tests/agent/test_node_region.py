"""A node's processes have no region in their environment (as on EC2); its tools still work.

The AWS SDKs never take the region from instance metadata, so the installer reads it there
(IMDSv2 ``placement/region``) and writes it where every unit, wrapper and tool finds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bootstrap_scripts.agent import install
from bootstrap_scripts.node import node_region
from emulator.deploy import REPO_ROOT, aws_env
from emulator.imds import MetadataServer
from emulator.nodes import base_env
from emulator.units import unit_exec

UNITS = ("dl-agent.service", "dl-executor.service", "dl-controller.service")


def master_args(root: Path, region: str = "us-east-1") -> list[str]:
    return ["--role", "master", "--cluster-id", "dlc", "--stack-name", "dlc", "--region",
            region, "--master-queue-url", "https://sqs/q-master", "--efs-id", "fs-0123abcd",
            "--mount-point", "/efs", "--wait-handle", "", "--setup-timeout", "3300",
            "--root", str(root), "--no-systemctl", "--python", sys.executable,
            "--package-dir", str(REPO_ROOT)]


def node_env(endpoint: str, **extra: str) -> dict[str, str]:
    """What an emulated node's process gets: no region (asserted, not assumed)."""
    env = {**base_env(aws_env(endpoint)), **extra}
    assert "AWS_REGION" not in env and "AWS_DEFAULT_REGION" not in env
    return env


def test_the_installer_takes_the_region_from_instance_metadata(tmp_path, monkeypatch):
    with MetadataServer() as imds:
        url = imds.start("127.0.0.1", 0, {"instance_id": "i-0abc", "address": "127.0.0.1",
                                          "region": "eu-west-3"})
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", url)
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
        # the IMDS guard has its drill (tests/security/test_node_imds_guard.py); here it
        # would leave a host-wide rule for this test's endpoint behind
        guarded: list[str | None] = []
        monkeypatch.setattr(install.imds_guard, "ensure",
                            lambda endpoint=None: guarded.append(endpoint) or "")
        # the user data says us-east-1; the instance is in eu-west-3: the instance wins
        install.install(master_args(tmp_path))
        assert guarded == [None]  # the installer asked for it (for botocore's endpoint)
    assert node_region.read_installed(tmp_path) == "eu-west-3"
    env_file = node_region.env_file(tmp_path)
    assert "AWS_DEFAULT_REGION=eu-west-3" in env_file.read_text()
    for unit in UNITS:
        text = (tmp_path / "etc/systemd/system" / unit).read_text()
        assert f"\nEnvironmentFile={env_file}\n" in text, unit
        _argv, env = unit_exec(text, unit)  # as the emulator (and systemd) read it
        assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "eu-west-3"
    for name in install.WRAPPERS:
        assert f". '{env_file}'" in (tmp_path / "usr/local/bin" / name).read_text()
    assert str(env_file) in (tmp_path / node_region.PROFILE_FILE).read_text()


def test_without_metadata_the_user_data_region_is_used_and_a_bad_one_refused(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    install.install(master_args(tmp_path, "ap-south-1"))
    assert node_region.read_installed(tmp_path) == "ap-south-1"
    assert install.main(master_args(tmp_path / "bad", "not a region")) == 1


def test_a_planted_region_file_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.env"
    target.write_text("AWS_REGION=eu-west-1\n")
    link = node_region.env_file(tmp_path)
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    assert node_region.read_installed(tmp_path) == ""


def test_the_emulated_imds_serves_the_region_and_the_identity_document():
    with MetadataServer() as imds:
        url = imds.start("127.0.0.1", 0, {"instance_id": "i-0abc", "address": "127.0.0.1",
                                          "region": "eu-north-1"})
        token = urllib.request.urlopen(urllib.request.Request(
            url + "latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})).read().decode()

        def get(path: str) -> str:
            return urllib.request.urlopen(urllib.request.Request(
                url + path, headers={"X-aws-ec2-metadata-token": token})).read().decode()

        assert get("latest/meta-data/placement/region") == "eu-north-1"
        doc = json.loads(get("latest/dynamic/instance-identity/document"))
        assert (doc["region"], doc["instanceId"]) == ("eu-north-1", "i-0abc")


@pytest.fixture()
def installed(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    install.install(master_args(tmp_path / "node"))
    return tmp_path / "node"


def test_instance_type_lookup_works_on_a_node_without_a_region(installed, tmp_path,
                                                               moto_endpoint):
    """The health gate's EC2 call (ops.instance_types), in a node's environment."""
    code = ("import sys; from pathlib import Path; from bootstrap_scripts.ops import "
            "instance_types as it; f = it.instance_type_facts(Path(sys.argv[1]), "
            "['g5.xlarge'])['g5.xlarge']; print(getattr(f, 'gpus', f))")
    (tmp_path / "efs").mkdir()
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "efs")], cwd=REPO_ROOT,
                         env=node_env(moto_endpoint, DL_ROOT=str(installed)),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1", res.stdout + res.stderr  # g5.xlarge: one A10G


def test_an_installed_command_finds_the_region_as_run_command_starts_it(installed,
                                                                        moto_endpoint):
    """dl-scale through its wrapper, with no region and no DL_ROOT: it gets as far as the
    cluster's membership (none here), not to "You must specify a region"."""
    env = node_env(moto_endpoint)
    env.pop("DL_ROOT", None)
    res = subprocess.run([str(installed / "usr/local/bin/dl-scale"), "--root", str(installed),
                          "--status"], cwd="/", env=env, capture_output=True, text=True,
                         timeout=60)
    out = res.stdout + res.stderr
    assert "region" not in out.lower(), out
    assert "membership" in out, out
    assert "Traceback" not in out, out


def test_a_tool_run_directly_adopts_the_installed_region(installed, monkeypatch):
    for variable in node_region.VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    assert node_region.adopt(installed) == "us-east-1"
    assert os.environ["AWS_REGION"] == "us-east-1"

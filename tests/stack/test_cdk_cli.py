"""The real CDK CLI (pinned in package.json) synthesizes the app with and without context."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.stack.synth import REPO

NPX = shutil.which("npx")
pytestmark = pytest.mark.skipif(
    not (REPO / "node_modules" / ".bin" / "cdk").exists() or NPX is None,
    reason="CDK CLI not installed: run `make setup`",
)


def cdk(*args: str, outdir: Path) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AWS_") or k in ("AWS_DEFAULT_REGION", "AWS_REGION")
    }
    env.update(
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="18,20",
        JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1",
        JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION="1",
        CDK_DISABLE_VERSION_CHECK="1",
        CDK_CLI_NOTICES="false",
    )
    return subprocess.run(
        [NPX, "cdk", *args, "--no-lookups", "-q", "--no-notices", "--output", str(outdir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_synth_without_context(tmp_path: Path) -> None:
    proc = cdk("synth", "DLClusterStack", outdir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    template = json.loads((tmp_path / "DLClusterStack.template.json").read_text())
    assert len(template["Resources"]) > 50


def test_synth_with_context(tmp_path: Path) -> None:
    proc = cdk(
        "synth",
        "DLClusterStack",
        "-c",
        "workerCount=4",
        "-c",
        "vpcCidr=127.20.0.0/16",
        "-c",
        "sshCidr=198.51.100.0/24",
        "-c",
        "rootVolumeGiB=64",
        outdir=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "DLClusterStack.template.json").read_text()
    t = json.loads(text)
    groups = [
        r for r in t["Resources"].values() if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"
    ]
    assert sorted(g["Properties"]["DesiredCapacity"] for g in groups) == ["1", "4"]
    assert '"CidrBlock": "127.20.0.0/16"' in text and "198.51.100.0/24" in text
    assert '"VolumeSize": 64' in text


def test_bad_context_fails_naming_key_and_value(tmp_path: Path) -> None:
    proc = cdk("synth", "DLClusterStack", "-c", "workerCount=0", outdir=tmp_path)
    assert proc.returncode != 0
    assert "context key 'workerCount' must be an integer >= 1, got '0'" in proc.stderr


def test_misspelt_key_fails_synth_naming_the_right_one(tmp_path: Path) -> None:
    """`-c workercount=3` used to deploy the default two workers without a word."""
    proc = cdk("synth", "DLClusterStack", "-c", "workercount=3", outdir=tmp_path)
    assert proc.returncode != 0
    assert "unknown context key 'workercount'; did you mean 'workerCount'?" in proc.stderr

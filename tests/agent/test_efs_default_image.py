"""The default image's EFS path end to end on one host: the user data the stack renders for
each image family, and what the agent does when the mount cannot work (docs/node-agent.md,
"Mounting EFS"): errors no retry can fix become a wait-condition FAILURE at once, naming why.

``mount``/``mountpoint``/``mount.efs`` are fakes on PATH that answer as the real tools do.
"""

from __future__ import annotations

import shlex
import subprocess
import threading
from pathlib import Path

import pytest

from bootstrap_scripts.agent.efs_mount import MountError, ensure_mounted
from bootstrap_scripts.agent.identity import NodeIdentity
from bootstrap_scripts.agent.node_agent import EXIT_FAILED, AgentConfig, NodeAgent
from bootstrap_scripts.agent.settings import build_parser
from constructs_lib.images import IMAGE_FAMILIES
from constructs_lib.user_data import (
    INSTALL_MODULE,
    MOUNT_TIMEOUT_SECONDS,
    RETRY_FUNCTION,
    render_bootstrap_commands,
)
from emulator.wait_handle import WaitHandle

ACCESS_DENIED = "mount.nfs4: access denied by server while mounting fs-12345678.efs:/"


def fake_mount(bindir: Path, calls: Path, *, stderr: str, efs_utils: bool) -> None:
    """A ``mount`` that always fails with ``stderr`` (exit 32, as mount(8) does)."""
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / "mount").write_text(
        f"#!/bin/sh\necho \"$@\" >> {calls}\necho {shlex.quote(stderr)} >&2\nexit 32\n")
    (bindir / "mountpoint").write_text("#!/bin/sh\nexit 1\n")
    if efs_utils:
        (bindir / "mount.efs").write_text("#!/bin/sh\nexit 0\n")
    for tool in bindir.iterdir():
        tool.chmod(0o755)


@pytest.fixture()
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{path}:/usr/bin:/bin")
    return path


def rendered(image_type: str) -> list[str]:
    family = IMAGE_FAMILIES[image_type]
    return render_bootstrap_commands(
        asset_s3_url="s3://bucket/scripts.zip", python=family.python,
        efs_utils_install=family.efs_utils_install,
        agent_settings={"role": "worker", "cluster-id": "c", "stack-name": "s",
                        "region": "us-east-1", "mount-timeout": str(MOUNT_TIMEOUT_SECONDS)})


def test_al2023_user_data_installs_efs_utils_from_its_repository_and_survives_a_failure(
        tmp_path: Path) -> None:
    """The install line runs under the user data's own ``set -euo pipefail``: a failed dnf
    must leave a message and let the boot continue (the agent then reports the mount)."""
    lines = rendered("amazon-linux-2023")
    (install,) = [line for line in lines if "amazon-efs-utils" in line and "dnf" in line]
    assert install.startswith("retry dnf install -y -q amazon-efs-utils || ")
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "dnf").write_text("#!/bin/sh\necho 'Error: Unable to find a match' >&2\nexit 1\n")
    (fakes / "dnf").chmod(0o755)
    no_wait = "sleep() { :; }"  # the retries' backoff, skipped here
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{no_wait}\n{RETRY_FUNCTION}\n"
                           f"{install}\necho boot-continues"],
                          capture_output=True, text=True, env={"PATH": f"{fakes}:/usr/bin:/bin"},
                          check=False)
    assert proc.returncode == 0 and "boot-continues" in proc.stdout
    assert "amazon-efs-utils install failed" in proc.stderr


def test_ubuntu_user_data_tries_no_package_manager_it_does_not_have() -> None:
    text = "\n".join(rendered("ubuntu"))
    assert "dnf" not in text and "apt" not in text
    assert "no amazon-efs-utils package" in text


@pytest.mark.parametrize("image_type", sorted(IMAGE_FAMILIES))
def test_rendered_mount_timeout_reaches_the_agent(image_type: str) -> None:
    (line,) = [ln for ln in rendered(image_type) if INSTALL_MODULE in ln]
    tokens = shlex.split(line)
    args = tokens[tokens.index(INSTALL_MODULE) + 1:]
    assert build_parser().parse_args(args).mount_timeout == MOUNT_TIMEOUT_SECONDS == 300


def test_plain_nfs_refused_by_the_tls_policy_fails_at_once_naming_mount_efs(
        tmp_path: Path, bindir: Path) -> None:
    calls = tmp_path / "calls"
    fake_mount(bindir, calls, stderr=ACCESS_DENIED, efs_utils=False)
    with pytest.raises(MountError) as err:
        ensure_mounted("fs-12345678", "us-east-1", str(tmp_path / "efs"), timeout=3600,
                       sleep=lambda _s: pytest.fail("a final error must not be retried"))
    assert len(calls.read_text().splitlines()) == 1
    text = str(err.value)
    assert "mount.efs (amazon-efs-utils) is not installed" in text
    assert "requires TLS" in text and "access denied by server" in text


def test_missing_mount_helper_is_final(tmp_path: Path, bindir: Path) -> None:
    fake_mount(bindir, tmp_path / "calls", efs_utils=True,
               stderr="mount: /efs: unknown filesystem type 'efs'.")
    with pytest.raises(MountError, match="cannot mount file-system type 'efs'"):
        ensure_mounted("fs-12345678", "us-east-1", str(tmp_path / "efs"), timeout=3600,
                       sleep=lambda _s: pytest.fail("a final error must not be retried"))


def test_access_denied_with_efs_utils_is_retried(tmp_path: Path, bindir: Path) -> None:
    """With ``-o tls,iam`` a refusal can be the new instance role not yet effective."""
    calls = tmp_path / "calls"
    fake_mount(bindir, calls, stderr="mount.nfs4: access denied by server", efs_utils=True)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt  # enough: it retries

    with pytest.raises(KeyboardInterrupt):
        ensure_mounted("fs-12345678", "us-east-1", str(tmp_path / "efs"), timeout=3600,
                       sleep=sleep)
    assert len(calls.read_text().splitlines()) == 3


def test_master_signals_the_reason_on_the_wait_condition(tmp_path: Path, bindir: Path) -> None:
    """The default-timeout master (900 s if it retried) fails on the first refusal."""
    fake_mount(bindir, tmp_path / "calls", stderr=ACCESS_DENIED, efs_utils=False)
    recorder = WaitHandle()
    try:
        config = AgentConfig(role="master", cluster_id="c", stack_name="s", region="us-east-1",
                             master_queue_url="http://localhost:1/q", efs_id="fs-12345678",
                             mount_point=str(tmp_path / "efs"), wait_handle=recorder.url,
                             root=str(tmp_path / "root"))
        agent = NodeAgent(config, identity=NodeIdentity("i-m", "g5.xlarge", "127.0.0.1",
                                                        "us-east-1"),
                          stop_event=threading.Event())
        assert agent.run() == EXIT_FAILED
        (sig,) = recorder.wait_for(1, timeout=30)
        assert sig["Status"] == "FAILURE"
        assert "node agent could not start: could not mount EFS fs-12345678" in sig["Reason"]
        assert "mount.efs (amazon-efs-utils) is not installed" in sig["Reason"]
    finally:
        recorder.stop()

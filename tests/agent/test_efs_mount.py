"""EFS mounting with fake ``mount``/``mountpoint`` commands on PATH."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bootstrap_scripts.agent import efs_mount
from bootstrap_scripts.agent.efs_mount import NFS_OPTIONS, MountError, ensure_mounted
from bootstrap_scripts.agent.identity import NodeIdentity
from bootstrap_scripts.agent.node_agent import EXIT_FAILED, AgentConfig, NodeAgent
from emulator.wait_handle import WaitHandle


def fake_tools(bindir: Path, state: Path, *, fail_times: int, efs_utils: bool = False) -> None:
    """``mount`` fails ``fail_times`` times, then "mounts" (a marker ``mountpoint`` checks)."""
    bindir.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    (bindir / "mount").write_text(f"""#!/bin/sh
echo "$@" >> {state}/calls
n=$(cat {state}/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {state}/count
if [ $n -le {fail_times} ]; then
  echo "mount.nfs4: Failed to resolve server fs-12345678.efs: Name or service not known" >&2
  exit 32
fi
for last; do :; done
echo "$last" > {state}/mounted
""")
    (bindir / "mountpoint").write_text(f"""#!/bin/sh
for last; do :; done
[ -f {state}/mounted ] && [ "$(cat {state}/mounted)" = "$last" ]
""")
    if efs_utils:
        (bindir / "mount.efs").write_text("#!/bin/sh\nexit 0\n")
    for tool in bindir.iterdir():
        tool.chmod(0o755)


@pytest.fixture()
def tools(tmp_path, monkeypatch):
    bindir, state = tmp_path / "bin", tmp_path / "state"
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    return bindir, state


def test_nfs_fallback_retries_until_the_mount_target_is_up(tmp_path, tools):
    bindir, state = tools
    fake_tools(bindir, state, fail_times=2)
    sleeps: list[float] = []
    mp = str(tmp_path / "efs")
    how = ensure_mounted("fs-12345678", "eu-west-1", mp, sleep=sleeps.append, timeout=60)
    assert how == "mounted"
    calls = (state / "calls").read_text().splitlines()
    assert len(calls) == 3
    assert calls[0] == (f"-t nfs4 -o {NFS_OPTIONS} "
                        f"fs-12345678.efs.eu-west-1.amazonaws.com:/ {mp}")
    assert sleeps == [2.0, 4.0]  # exponential backoff


def test_efs_utils_with_tls_when_installed(tmp_path, tools):
    bindir, state = tools
    fake_tools(bindir, state, fail_times=0, efs_utils=True)
    mp = str(tmp_path / "efs")
    assert ensure_mounted("fs-12345678", "us-east-1", mp, sleep=lambda _s: None) == "mounted"
    assert (state / "calls").read_text().strip() == f"-t efs -o tls,iam fs-12345678:/ {mp}"


def test_already_mounted_is_left_alone(tmp_path, tools):
    bindir, state = tools
    fake_tools(bindir, state, fail_times=0)
    mp = str(tmp_path / "efs")
    (state / "mounted").write_text(mp + "\n")
    assert ensure_mounted("fs-12345678", "us-east-1", mp) == "existing"
    assert not (state / "calls").exists()


def test_never_mounts_gives_a_clear_error(tmp_path, tools, monkeypatch):
    bindir, state = tools
    fake_tools(bindir, state, fail_times=10**6)
    clock = iter(range(0, 10**6, 7))  # each look at the clock: 7 s later
    monkeypatch.setattr(efs_mount, "time",
                        type("FakeTime", (), {"monotonic": staticmethod(lambda: next(clock))}))
    with pytest.raises(MountError) as err:
        ensure_mounted("fs-12345678", "us-east-1", str(tmp_path / "efs"), timeout=30,
                       sleep=lambda _s: None)
    text = str(err.value)
    assert "fs-12345678" in text and str(tmp_path / "efs") in text
    assert "Name or service not known" in text


@pytest.mark.parametrize(("efs_id", "why"), [("", "no --efs-id"),
                                             ("vol-123", "'vol-123' is not an EFS")])
def test_bad_file_system_id(tmp_path, tools, efs_id, why):
    fake_tools(*tools, fail_times=0)
    with pytest.raises(MountError, match=why):
        ensure_mounted(efs_id, "us-east-1", str(tmp_path / "efs"))


def test_no_mount_uses_a_plain_directory(tmp_path):
    assert ensure_mounted("", "us-east-1", str(tmp_path / "shared"), no_mount=True) == \
        "directory"
    assert (tmp_path / "shared").is_dir()


def test_master_signals_failure_when_efs_never_mounts(tmp_path, tools):
    fake_tools(*tools, fail_times=10**6)
    recorder = WaitHandle()
    try:
        config = AgentConfig(role="master", cluster_id="c", stack_name="s", region="us-east-1",
                             master_queue_url="http://localhost:1/q", efs_id="fs-12345678",
                             mount_point=str(tmp_path / "efs"), wait_handle=recorder.url,
                             root=str(tmp_path / "root"), mount_timeout=0.5)
        agent = NodeAgent(config, identity=NodeIdentity("i-m", "p3.2xlarge", "127.0.0.1",
                                                        "us-east-1"),
                          stop_event=threading.Event())
        assert agent.run() == EXIT_FAILED
        (sig,) = recorder.wait_for(1, timeout=10)
        assert sig["Status"] == "FAILURE"
        assert "could not mount EFS fs-12345678" in sig["Reason"]
    finally:
        recorder.stop()

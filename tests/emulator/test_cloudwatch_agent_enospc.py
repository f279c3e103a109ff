"""The emulator's CloudWatch agent carries on after a full disk (ENOSPC on its state
directory, a real full tmpfs), as systemd restarts the real agent: it keeps shipping, its
lines go again once space returns (at least once), and it leaves no temporary file."""

from __future__ import annotations

import contextlib
import os
import subprocess

import boto3
import pytest

from bootstrap_scripts.agent import cloudwatch_config
from emulator.cloudwatch_agent import Shipper
from emulator.deploy import REGION

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
GROUP = "/deeplearning/c1"


@pytest.fixture()
def full_state_dir(tmp_path):
    mnt = tmp_path / "state"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "faults-cw", str(mnt)],
                   check=True, timeout=30)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=30)


def fill(directory) -> int:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):
        while True:
            os.write(fd, b"\0" * 4096)
    return fd


def test_a_full_disk_does_not_stop_the_agent(tmp_path, moto_reset, full_state_dir):
    logs = boto3.client("logs", endpoint_url=moto_reset, region_name=REGION)
    logs.create_log_group(logGroupName=GROUP)
    root = tmp_path / "i-0aaa"
    config = root / cloudwatch_config.CONFIG_PATH
    config.parent.mkdir(parents=True)
    config.write_text(cloudwatch_config.render(root=root, log_group=GROUP,
                                               instance_id="i-0aaa", master=False))
    (root / cloudwatch_config.LOG_DIR).mkdir(parents=True)
    agent_log = cloudwatch_config.unit_log(root, "agent")
    agent_log.write_text("before the disk filled\n")
    shipper = Shipper(logs, cloudwatch_config.collected(config.read_text()), full_state_dir)
    fd = fill(full_state_dir)
    assert shipper.ship_once() == 1  # shipped; its position could not be saved
    assert sorted(p.name for p in full_state_dir.iterdir()) == ["filler"]  # no tmp left
    os.close(fd)
    os.unlink(full_state_dir / "filler")  # space again
    with open(agent_log, "a") as f:
        f.write("after\n")
    assert shipper.ship_once() == 2  # from the last saved position: at least once
    assert shipper.ship_once() == 0
    events = [e["message"] for e in logs.get_log_events(
        logGroupName=GROUP, logStreamName="i-0aaa/agent", startFromHead=True)["events"]]
    assert events == ["before the disk filled", "before the disk filled", "after"]

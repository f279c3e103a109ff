"""``Node.boot_delay`` (``make demo --boot-delay``): the machine answers on its metadata
endpoint at once, and its user data runs only after the OS boot, as on a real Deep Learning
AMI (docs/emulator.md). One metadata-server process is started and stopped here; the
installer is replaced by a probe that records when the user data would have run."""

from __future__ import annotations

import time
import urllib.request

import pytest

from emulator.deploy import Instance
from emulator.nodes import Node, stop_nodes


class _UserDataRan(Exception):
    pass


def test_user_data_runs_after_the_boot_delay(tmp_path, monkeypatch) -> None:
    delay = 1.5
    node = Node(Instance("i-0123456789abcdef0", "127.20.9.9", "running", "g5.xlarge"),
                "worker", tmp_path / "root", tmp_path / "efs", tmp_path / "logs",
                boot_delay=delay)
    seen: dict[str, float] = {}

    def probe(_self, _args, _handle) -> None:
        seen["user_data"] = time.monotonic()
        with urllib.request.urlopen(urllib.request.Request(
                f"{node.imds_url}/latest/api/token", method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}), timeout=5) as r:
            seen["imds"] = r.status
        raise _UserDataRan

    monkeypatch.setattr(Node, "_install", probe)
    started = time.monotonic()
    try:
        with pytest.raises(_UserDataRan):
            node.boot([], {}, "")
    finally:
        assert not stop_nodes([node])
    waited = seen["user_data"] - started
    assert seen["imds"] == 200  # the metadata endpoint answered throughout
    assert waited >= delay


def test_no_boot_delay_by_default(tmp_path) -> None:
    node = Node(Instance("i-0123456789abcdef0", "127.20.9.9", "running", "g5.xlarge"),
                "worker", tmp_path / "root", tmp_path / "efs", tmp_path / "logs")
    assert node.boot_delay == 0.0

"""The ``--keep`` shell's wrappers: every command the installer gives people is there."""

from __future__ import annotations

from bootstrap_scripts.agent.install import WRAPPERS
from emulator.demo import shell
from emulator.demo.context import BIN_DIR


def test_every_installed_command_but_the_agent_gets_a_wrapper(tmp_path):
    root = tmp_path / "node"
    (root / BIN_DIR).mkdir(parents=True)
    for name in WRAPPERS:
        (root / BIN_DIR / name).write_text("#!/bin/sh\n")
    shell.write_node_shell(tmp_path, "master", root, "127.20.0.5", {})
    wrapped = sorted(p.name for p in (tmp_path / "master-bin").iterdir())
    assert wrapped == sorted(set(WRAPPERS) - {"dl-agent"})
    assert "dl-jobs" in wrapped
    text = (tmp_path / "master-bin" / "dl-jobs").read_text()
    assert f"--root {root}" in text

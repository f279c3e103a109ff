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


def test_a_slurm_masters_shell_finds_its_slurm_conf(tmp_path):
    """scheduler=slurm: sbatch/srun in the master's shell read the node's own slurm.conf
    (``/etc/slurm/slurm.conf`` on an instance) and carry the bind preload to their tasks."""
    from bootstrap_scripts.protocol.slurm_paths import SlurmPaths

    root = tmp_path / "node"
    (root / BIN_DIR).mkdir(parents=True)
    _, env_file = shell.write_node_shell(tmp_path, "master", root, "127.20.0.5", {})
    assert "SLURM_CONF" not in env_file.read_text()  # the native scheduler: nothing of Slurm
    conf = SlurmPaths(root).slurm_conf
    conf.parent.mkdir(parents=True)
    conf.write_text("ClusterName=c\n")
    _, env_file = shell.write_node_shell(tmp_path, "master", root, "127.20.0.5", {})
    text = env_file.read_text()
    assert f"export SLURM_CONF={conf}" in text
    assert "export LD_PRELOAD=" in text and "export DEEPLEARNING_NODE_CONNECT=1" in text

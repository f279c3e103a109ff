"""What the EMR bootstrap action installs on a node: ``dl-run`` and two systemd units.

- ``usr/local/bin/dl-run``: waits until the membership watcher has written this node's
  membership, then runs the ordinary runner (``bootstrap_scripts.jobs.cli.dl_run``), so a step
  submitted as soon as the cluster is up does not race the watcher;
- ``dl-emr-metadata.service``: the membership watcher (``bootstrap_scripts.emr.metadata
  watch``), restarted whenever it exits;
- ``dl-executor.service``: the per-node job executor, the same unit the EC2 nodes run.

Imported only once the node scripts are unpacked (the bootstrap action runs
:mod:`bootstrap_scripts.emr.metadata` as a downloaded file first).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bootstrap_scripts.agent import install
from bootstrap_scripts.protocol import store

METADATA_MODULE = "bootstrap_scripts.emr.metadata"
WATCH_UNIT = "dl-emr-metadata.service"
EXECUTOR_UNIT = install.EXECUTOR_UNIT
BIN_DIR = install.BIN_DIR
UNIT_DIR = install.UNIT_DIR


def dl_run_wrapper(python: str, lib_dir: str, root: str, efs_mount: str) -> str:
    """``dl-run`` for EMR: wait for the membership, then the ordinary runner."""
    return f"""#!/bin/sh
# Installed by bootstrap_scripts.emr.services (EMR). Waits for this node's membership, so a
# step that starts as soon as the cluster is up does not race the membership watcher. EMR
# nodes run no job controller (YARN owns the steps), so jobs run unmanaged: the runner
# itself launches and watches them, and torchrun's own restarts still apply.
PYTHONPATH='{lib_dir}'${{PYTHONPATH:+:$PYTHONPATH}}
export PYTHONPATH
'{python}' -m {METADATA_MODULE} wait --root '{root}' || exit $?
exec '{python}' -m bootstrap_scripts.jobs.cli.dl_run --unmanaged --root '{root}' \\
  --mount-point '{efs_mount}' "$@"
"""


def watch_unit(python: str, lib_dir: str, args: list[str]) -> str:
    """The systemd unit of the membership watcher (``metadata watch <args>``)."""
    return install.python_unit(
        description="Deep-learning cluster membership on EMR (workers file, DEEPLEARNING_* env)",
        python=python, package_dir=lib_dir, module=METADATA_MODULE, args=["watch", *args],
        unit=("Wants=network-online.target", "After=network-online.target remote-fs.target"),
        service=("Restart=always", "RestartSec=10"))


def install_node_services(*, root: str, python: str, lib_dir: str, efs_mount: str,
                          watch_args: list[str], systemctl: bool = True) -> list[Path]:
    """Write the dl-run wrapper and the watcher + executor units under ``root``; with
    ``systemctl``, enable and start both units without waiting for them."""
    r = Path(root)
    files = {
        r / BIN_DIR / "dl-run": (dl_run_wrapper(python, lib_dir, "/", efs_mount), 0o755),
        r / UNIT_DIR / WATCH_UNIT: (watch_unit(python, lib_dir, watch_args), 0o644),
        r / UNIT_DIR / EXECUTOR_UNIT: (
            install.executor_unit(python, lib_dir, "/", efs_mount), 0o644),
    }
    written = []
    for path, (content, mode) in files.items():
        store.atomic_write(path, content, mode=mode)
        written.append(path)
    if systemctl:
        subprocess.run(["systemctl", "daemon-reload"], check=True)
        # --no-block: the executor waits for the watcher's membership, and the bootstrap
        # action must return for EMR to go on starting the cluster.
        subprocess.run(["systemctl", "enable", "--now", "--no-block", WATCH_UNIT,
                        EXECUTOR_UNIT], check=True)
    return written

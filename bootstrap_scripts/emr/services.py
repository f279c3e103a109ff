"""What the EMR bootstrap action installs on a node: ``dl-run``, the node's region, its
default ``--data-checksums`` and two systemd units.

- ``usr/local/bin/dl-run``: waits until the membership watcher has written this node's
  membership, then runs the ordinary runner (``bootstrap_scripts.jobs.cli.dl_run``), so a step
  submitted as soon as the cluster is up does not race the watcher;
- ``dl-emr-metadata.service``: the membership watcher (``bootstrap_scripts.emr.metadata
  watch``), restarted whenever it exits;
- ``dl-executor.service``: the per-node job executor, the same unit the EC2 nodes run;
- ``etc/dl-cluster/aws-region.env`` (``node_region.ENV_FILE``) and its login-shell
  snippet, as the EC2 installer writes them: both units read it (``EnvironmentFile=``,
  which systemd requires to exist: without it neither unit starts), and so do the tools
  that take the region only from there (``dl-run --data``'s stager, the checkpoint
  mirror);
- ``etc/dl-cluster/data-checksums`` (``checksums.SETTING_FILE``): the cluster's default of
  ``dl-run --data-checksums`` (the construct's ``data_checksums``, ``emrDataChecksums``),
  where dl-run reads it on the EC2 nodes too (``checksums.node_default``): a ``--data``
  step that gives no ``--data-checksums`` takes it.

Imported only once the node scripts are unpacked (the bootstrap action runs
:mod:`bootstrap_scripts.emr.metadata` as a downloaded file first).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bootstrap_scripts.agent import install
from bootstrap_scripts.data import checksums
from bootstrap_scripts.node import node_region
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
                          watch_args: list[str], region: str, systemctl: bool = True,
                          data_checksums: str = checksums.WARN) -> list[Path]:
    """Write the region file (``region``), the dl-run wrapper, its default
    ``--data-checksums`` (``data_checksums``) and the watcher + executor units under
    ``root``; with ``systemctl``, enable and start both units without waiting for them.
    ``node_region.RegionError`` for a region that is not one; ValueError for a mode the
    node does not know: the node would read that as ``warn`` (``checksums.node_default``),
    weaker than asked."""
    if data_checksums not in checksums.MODES:
        raise ValueError(f"--data-checksums must be one of {', '.join(checksums.MODES)}, "
                         f"got {data_checksums!r}")
    r = Path(root)
    files = {
        # first: both units read it
        node_region.env_file(r): (node_region.render_env_file(region), 0o644),
        r / node_region.PROFILE_FILE: (node_region.render_profile("/"), 0o644),
        r / BIN_DIR / "dl-run": (dl_run_wrapper(python, lib_dir, "/", efs_mount), 0o755),
        r / UNIT_DIR / WATCH_UNIT: (watch_unit(python, lib_dir, watch_args), 0o644),
        r / UNIT_DIR / EXECUTOR_UNIT: (
            install.executor_unit(python, lib_dir, "/", efs_mount), 0o644),
        # dl-run's default --data-checksums on this node (the construct's data_checksums)
        r / checksums.SETTING_FILE: (checksums.render_setting(data_checksums), 0o644),
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

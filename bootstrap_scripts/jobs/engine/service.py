"""What the engine's two services do alike as they start: the executor (every node) and the
job controller (the master), both long-running programs under systemd.

- their log lines on stderr, which the journal keeps: time, program, level, message;
- the node's EFS mount point: ``--mount-point``, else the one its node agent wrote
  (``EFS_MOUNT``, ``node_env``), else ``/efs``;
- a stop on SIGTERM (``systemctl stop``) or SIGINT: the service's ``stopping`` is set and
  it finishes the pass it is in, leaving its records whole, rather than dying mid-write.

Here, in the shared core, so that neither program imports the other's modules for it.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Protocol

from bootstrap_scripts.jobs.engine.node_env import read_node_env
from bootstrap_scripts.protocol.paths import NodePaths

#: The mount point when neither the command line nor the node's variables give one.
DEFAULT_EFS_MOUNT = "/efs"


class Stoppable(Protocol):
    """A service whose loop ends after the pass in which ``stopping`` became true."""

    stopping: bool


def start_logging(program: str, *, verbose: bool) -> None:
    """``program``'s log lines on stderr (DEBUG with ``verbose``, else INFO)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {program} %(levelname)s %(message)s")


def efs_mount(root: Path, given: str | None) -> Path:
    """The node's EFS mount point: ``given``, else its node agent's ``EFS_MOUNT``, else
    :data:`DEFAULT_EFS_MOUNT`."""
    return Path(given or read_node_env(NodePaths(root)).get("EFS_MOUNT", "")
                or DEFAULT_EFS_MOUNT)


def stop_on_signals(service: Stoppable) -> None:
    """SIGTERM and SIGINT set ``service.stopping`` (the service ends after its pass)."""

    def stop(signum: int, _frame: object) -> None:
        service.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

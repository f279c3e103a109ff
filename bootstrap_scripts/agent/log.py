"""Logging for the node agent: the journal (stderr) and ``<EFS>/cluster/logs/<id>.log``.

One line per event, ``key=value`` pairs after a fixed prefix, so ``grep event=publish``
across every node's log on EFS answers "when did each node see generation N".
Each agent gets its own logger (``dl-agent.<instance-id>``) so several agents can share one
process (the emulator and the benchmark run them as threads).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s %(message)s"
DATEFMT = "%Y-%m-%dT%H:%M:%S"


def _formatter() -> logging.Formatter:
    fmt = logging.Formatter(FORMAT, DATEFMT)
    fmt.converter = time.gmtime
    return fmt


class StderrHandler(logging.StreamHandler):
    """The agent's stderr handler (a class of its own, so it is installed once)."""


def configure_stderr(level: int = logging.INFO) -> None:
    """Process-wide: everything to stderr (systemd puts it in the journal)."""
    root = logging.getLogger()
    if not any(isinstance(h, StderrHandler) for h in root.handlers):
        handler = StderrHandler(sys.stderr)
        handler.setFormatter(_formatter())
        root.addHandler(handler)
    root.setLevel(level)
    # botocore's debug chatter is not ours to print.
    logging.getLogger("botocore").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)


def agent_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(f"dl-agent.{name}")
    logger.setLevel(logging.INFO)
    return logger


def add_file_log(logger: logging.Logger, path: str | Path) -> logging.Handler:
    """Also append this agent's lines to ``path`` (its per-node log on EFS)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_formatter())
    logger.addHandler(handler)
    return handler

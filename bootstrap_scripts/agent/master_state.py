"""The master agent's memory across its restarts (``var/lib/dl-agent/state.json``, local
disk, this instance only), and the ``asg-setup`` messages it keeps there.

Its own module so that :mod:`.master` (which writes it) and :mod:`.formation` (which forms
the cluster from the kept messages) both import it, and neither imports the other back.
"""

from __future__ import annotations

import os
from dataclasses import field
from typing import ClassVar

from bootstrap_scripts.protocol import bounds, state
from bootstrap_scripts.protocol.record_base import Record, record


@record
class GroupSetup(Record):
    """An ``asg-setup`` message as the master keeps it (the same fields)."""

    KIND: ClassVar[str] = "asg-setup seen"
    status: str
    asg: str
    role: str
    cluster_id: str = ""
    desired: int = 0
    launched: int = 0
    min: int = 0
    max: int = 0
    instances: tuple[str, ...] = ()
    reason: str = ""
    cause: str = ""
    dedupe_key: str = ""


@record
class MasterState(Record):
    """``var/lib/dl-agent/state.json``: what the master remembers across an agent restart
    (local disk, this instance only): when setup started (the deadline counts from there)
    and the setup messages it already deleted from the queue."""

    KIND: ClassVar[str] = "master agent state"
    setup_started: float
    setup: dict[str, GroupSetup] = field(default_factory=dict)  # role -> asg-setup


#: The documented ranges of the numbers in ``state.json`` (docs/protocol.md, "Numbers").
STATE_RANGES = {"setup_started": bounds.TIME}
SETUP_RANGES = {"desired": bounds.COUNT, "launched": bounds.COUNT, "min": bounds.COUNT,
                "max": bounds.COUNT}


def load_state(path: str | os.PathLike) -> MasterState | None:
    """``state.json``, or None when absent, malformed or out of range (logged, once)."""
    kept = state.read_checked(path, MasterState, STATE_RANGES)
    if kept is not None and all(
            state.read_checked_fields(seen, SETUP_RANGES, source=f"{path} setup.{role}")
            for role, seen in kept.setup.items()):
        return kept
    return None

"""What the executor knows of one share it started (or took back after a restart): its
processes, its process group and token, and how far its stopping has got.

The state of :class:`bootstrap_scripts.jobs.executor.shares.Shares`; kept apart so the
supervision code reads in one sitting."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from bootstrap_scripts.jobs.engine.rdzv_store import RDZV_STORE_LABEL
from bootstrap_scripts.jobs.executor.reattach import AdoptedProcess
from bootstrap_scripts.node import procgroup
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.liveness import Sighting
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import FAULT_INFRASTRUCTURE


@dataclass
class RunningProc:
    proc: Proc
    popen: subprocess.Popen | AdoptedProcess


@dataclass
class RunningShare:
    spec: JobSpec
    share: Share
    paths: JobPaths
    pgid: int
    procs: list[RunningProc]
    started_at: float
    #: the runner's heartbeat as this executor last saw it (``protocol.liveness``)
    runner_seen: Sighting | None = None
    cancel_reason: str = ""
    #: SIGTERM -> SIGKILL for this stop when not the job's ``--grace`` (a hang stop)
    stop_grace: float | None = None
    term_sent: float | None = None
    kill_sent: bool = False
    drained: bool = False
    #: when the master's agent succeeded and the share began holding the store for peers
    held_since: float | None = None
    #: peers' executor heartbeats as this executor last saw them (``protocol.liveness``)
    peer_beats: dict[str, Sighting] = field(default_factory=dict)
    #: set when the node's machinery, not the job, ended the share (``ShareExit.fault``)
    fault: str = ""
    fault_reason: str = ""
    #: the job's owner, whose rights every write into its directory uses (-1: ours)
    uid: int = -1
    gid: int = -1
    #: the job's user (name, uid, gid): whose job role credentials this share holds
    owner: tuple[str, int, int] = ("", -1, -1)
    #: the node's OOM kill counter as the share started (``oom.py``; None: not known)
    oom_kills: int | None = None

    @property
    def grace(self) -> float:
        return self.spec.grace_seconds if self.stop_grace is None else self.stop_grace

    @property
    def token(self) -> str:
        return procgroup.share_token(self.paths.key, self.share.rank, self.share.address)

    def signal(self, sig: int) -> None:
        if self.pgid:
            procgroup.signal_share(self.pgid, self.token, sig)

    def main_done(self) -> bool:
        return all(p.popen.poll() is not None for p in self.procs if p.proc.wait)

    def returncode(self) -> int:
        for p in self.procs:
            if p.proc.wait and p.popen.returncode not in (0, None):
                return p.popen.returncode
        return 0

    def status_lost(self) -> bool:
        """A main process re-attached after an executor restart ended without a known
        status (helpers, stopped by us once the main ones ended, do not count)."""
        return any(isinstance(p.popen, AdoptedProcess) and p.popen.lost
                   for p in self.procs if p.proc.wait)

    def infrastructure_fault(self) -> tuple[str, str]:
        """(``ShareExit.fault``, reason) when the node's machinery ended the share."""
        if self.fault:
            return self.fault, self.fault_reason
        if self.status_lost() and not self.cancel_reason:
            return FAULT_INFRASTRUCTURE, ("the job executor restarted while the share ran "
                                          "and could not collect its exit status")
        return "", ""

    def rdzv_store(self) -> RunningProc | None:
        """The helper serving the job's rendezvous store (the master's torchrun share)."""
        return next((p for p in self.procs
                     if p.proc.label == RDZV_STORE_LABEL and not p.proc.wait), None)



"""Idle stop of the master: after the workers were stopped and the cluster stayed idle a
further ``master_seconds`` (the stack setting ``idleStopMasterMinutes``; the controller's
``--idle-stop-master-seconds``), the master's own group goes to zero, and ``dlc submit`` /
``dlc up`` set it back to one (``dlc/wake.py``).

Why the master stops at all: it is a GPU instance that also trains (a g5.xlarge bills
$1.006 an hour in us-east-1 whether it runs anything or not, docs/cost.md), and with the
workers stopped it is the whole idle bill. Why not a small control-plane instance apart from
the GPUs, as ParallelCluster's head node: the master is rank 0 and hosts every job's
rendezvous on the GPUs the cluster pays for anyway while it trains; a separate head node
would bill every hour the cluster exists, idle or not (docs/capacity.md "Idle stop").

Who releases the master: not the master. The master agent protects it from scale-in and
neither CloudFormation nor Auto Scaling ever lifts that, so the group cannot simply be set
to 0; the stack's own code that lifts protection and sets a group to 0, 0, 0 with rounds
against an agent protecting again (``lambda_src/cluster_release.release``, the stack's
deletion and a Capacity Block's end) runs in the capacity adjuster's function. The
controller invokes that function asynchronously with :func:`release_request` (the master's
role may invoke it, nothing more), so the release goes on while the master it terminates
dies, and the function refuses a request whose instance is no longer the group's (a woken
master is never released by a stale request).

What survives: everything on EFS (jobs, their logs and checkpoints, the membership, the
idle-stop record, the breaker's marks, the node keys' book); the checkpoint bucket. What is
lost: the master's node-local state (its root volume: ``/var/lib/dl-agent``, local scratch,
the rendezvous store of no job since none runs, the node's logs not yet shipped to
CloudWatch). The new master takes the formed cluster over as after a lost master
(``agent/formation.py``).

When it may stop (:func:`may_stop`, the whole rule): the workers' stop was made and recorded;
no managed job runs or waits; no job share runs on a live node; no session is open on the
master (an SSM session or command, ``dlc``'s included, or an SSH login: :func:`open_sessions`,
what the master can see of them); no worker instance is left in the worker group; and
``master_seconds`` passed since the later of the workers' stop and this controller's start
(so a woken or replaced master gets the whole period again before it stops).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger("dl-controller")
#: The stack's default (``idleStopMasterMinutes``), in the controller's unit.
DEFAULT_MASTER_SECONDS = 3600.0
#: The event key of the capacity adjuster's idle master release (``lambda_src``'s twin:
#: ``lambda_src/cluster_release.IDLE_MASTER_KEY``; a contract test holds them together).
IDLE_MASTER_KEY = "dl-idle-master-release"
#: The processes of a session on the master: SSM's session and Run Command workers (every
#: ``dlc`` command, a tunnel, a shell), an SSH login's privilege-separated child.
SESSION_PROCESSES = ("ssm-session-worker", "ssm-document-worker")
#: Seconds between two release requests while this master still runs (the function's
#: asynchronous invocation may have failed every retry).
REQUEST_AGAIN_SECONDS = 600.0
#: Seconds between two looks at the sessions and the worker group once the time has come.
LOOK_SECONDS = 30.0


@dataclass(frozen=True)
class Verdict:
    """Whether the master stops now, and why not (``wait``), and when it would."""

    stop: bool
    wait: str = ""
    stop_at: float | None = None


def may_stop(*, master_seconds: float, workers_stopped_at: float | None, started_at: float,
             now: float, queued: bool, sharing: bool, sessions: tuple[str, ...] = (),
             workers_left: int = 0) -> Verdict:
    """The master-stop rule (pure; module doc). ``workers_stopped_at``: when the workers'
    stop was recorded made (None: not stopped, or only "stopping"); ``started_at``: this
    controller's start; ``sessions``: what :func:`open_sessions` found; ``workers_left``:
    worker instances still in their group."""
    if master_seconds <= 0:
        return Verdict(False, "off")
    if workers_stopped_at is None:
        return Verdict(False, "the workers are not stopped")
    stop_at = max(workers_stopped_at, started_at) + master_seconds
    if queued:
        return Verdict(False, "a managed job runs or waits")
    if sharing:
        return Verdict(False, "a job share runs")
    if sessions:
        return Verdict(False, f"a session is open on the master ({', '.join(sessions)})",
                       stop_at)
    if now < stop_at:
        return Verdict(False, "idle", stop_at)
    if workers_left:
        return Verdict(False, f"{workers_left} worker instance(s) still in their group",
                       stop_at)
    return Verdict(True, "", stop_at)


def open_sessions(proc: Path = Path("/proc")) -> tuple[str, ...]:
    """``name[pid]`` of every session process on this machine (``SESSION_PROCESSES``, and
    ``sshd: user@...``, an SSH login's child). What cannot be read (a process gone) is
    skipped."""
    found: list[str] = []
    # the kernel keeps 15 characters of a process's name (TASK_COMM_LEN): both are longer
    names = {name[:15]: name for name in SESSION_PROCESSES}
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return ()
    for entry in entries:
        try:
            comm = (entry / "comm").read_text().strip()
            if comm in names:
                found.append(f"{names[comm]}[{entry.name}]")
            elif comm == "sshd":
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    "utf-8", "replace").strip()
                if cmd.startswith("sshd:") and "@" in cmd:
                    found.append(f"{cmd}[{entry.name}]")
        except OSError:
            continue
    return tuple(sorted(found))


def release_request(group: str, instance_id: str) -> dict[str, Any]:
    """The capacity adjuster's event: release ``group`` if ``instance_id`` is still in it."""
    return {IDLE_MASTER_KEY: {"Group": group, "InstanceId": instance_id}}


#: Reads the worker group's instance count and the master group's name (AWS calls).
Groups = Callable[[], tuple[int, str]]
#: Sends one release request (the function's asynchronous invocation).
Request = Callable[[dict[str, Any]], None]


class MasterStop:
    """The controller's side, called by ``IdleStop`` while the workers are stopped. It
    keeps no state of its own beyond the last request's time: the record (``IdleStopRecord``'s
    ``master_*`` fields) is written by its caller, before the request is sent."""

    def __init__(self, *, master_seconds: float, instance_id: str, groups: Groups,
                 request: Request, started_at: float | None = None,
                 sessions: Callable[[], tuple[str, ...]] = open_sessions,
                 clock: Callable[[], float] = time.time) -> None:
        if master_seconds < 0:
            raise ValueError(f"--idle-stop-master-seconds must be >= 0, got {master_seconds}")
        self.master_seconds, self.instance_id = master_seconds, instance_id
        self.groups, self.request, self.sessions, self.clock = groups, request, sessions, clock
        self.started_at = clock() if started_at is None else started_at
        self.requested_at: float | None = None
        self.waiting = ""
        self.look_at = 0.0

    def verdict(self, *, workers_stopped_at: float | None, sharing: bool) -> Verdict:
        """:func:`may_stop` now. The sessions and the worker group (an AWS call) are looked
        at only when all else says stop, and then at most every :data:`LOOK_SECONDS`."""
        now = self.clock()
        kw: dict[str, Any] = dict(
            master_seconds=self.master_seconds, workers_stopped_at=workers_stopped_at,
            started_at=self.started_at, now=now, queued=False, sharing=sharing)
        first = may_stop(**kw)
        if not first.stop:
            return first
        if now < self.look_at:
            return Verdict(False, self.waiting or "looking again", first.stop_at)
        self.look_at = now + LOOK_SECONDS
        sessions = self.sessions()
        left = 0 if sessions else self.groups()[0]
        return may_stop(**kw, sessions=sessions, workers_left=left)

    def due_again(self) -> bool:
        """This master still runs :data:`REQUEST_AGAIN_SECONDS` after its last request."""
        return (self.requested_at is None
                or self.clock() - self.requested_at >= REQUEST_AGAIN_SECONDS)

    def send(self) -> str:
        """Ask the function to release the master group; returns the group's name. Raises
        what the clients raise."""
        _, group = self.groups()
        self.request(release_request(group, self.instance_id))
        self.requested_at = self.clock()
        LOG.info("idle stop: master group %s: release of %s requested (the master stops)",
                 group, self.instance_id)
        return group

    def note(self, verdict: Verdict) -> None:
        """Log why the master waits, once per reason."""
        if verdict.wait != self.waiting and verdict.wait not in ("", "idle", "off"):
            LOG.info("idle stop: the master does not stop yet: %s", verdict.wait)
        self.waiting = verdict.wait


def master_actions(function_name: str, region: str, cluster_id: Callable[[], str]
                   ) -> tuple[Groups, Request]:
    """The two AWS sides: the groups found by the cluster's tags (``agent.discovery``) and
    the function's asynchronous invocation (``InvocationType=Event``)."""
    import boto3

    session = boto3.session.Session(region_name=region or None)

    def groups() -> tuple[int, str]:
        from bootstrap_scripts.agent import discovery as disco

        autoscaling = session.client("autoscaling")
        workers = disco.find_group(autoscaling, cluster_id(), "worker")
        master = disco.find_group(autoscaling, cluster_id(), "master")
        if master is None:
            raise RuntimeError(f"cluster {cluster_id()!r} has no master group")
        return (len((workers or {}).get("Instances") or []),
                str(master["AutoScalingGroupName"]))

    def request(event: dict[str, Any]) -> None:
        session.client("lambda").invoke(FunctionName=function_name, InvocationType="Event",
                                        Payload=json.dumps(event).encode())

    return groups, request

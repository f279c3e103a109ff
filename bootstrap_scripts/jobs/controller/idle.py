"""Idle stop: a cluster with nothing to run scales its workers to zero; the next job scales
them back (the stack setting ``idleStopMinutes``; the controller's ``--idle-stop-seconds``).

Why the job controller: it is the one process that knows the managed queue (it runs it),
and the master's role already has the Auto Scaling calls this needs on this cluster's
groups (scale-in protection, desired capacity; the stack adds UpdateAutoScalingGroup on
the worker group alone, limited to lowering and restoring its minimum).

Idle means: no managed job running or queued, and no job share (managed or a
``dl-run --unmanaged`` one) running on any node whose executor is alive (its heartbeat's
``running``). After ``idle_seconds`` of that, the workers stop through the group's
ordinary scale-in (``ops.scale.stop_all_workers``): each is drained by the termination
hook and the master agent, as ``dl-scale`` does. The master stays. A job queued on a
stopped cluster scales the group back to its size before the stop
(``ops.scale.restore_workers``) and waits for its nodes as any managed job waits for a
replacement. The state is ``cluster/idle-stop.json`` (``IdleStopRecord``): a restarted
controller carries on where the previous one was. :func:`decide` is the whole rule. While
the workers are stopped, the master itself may stop later (``idle_master``: its rule, its
release; the "master" of :class:`IdleStop`).

The record comes before the act: the "stopping" record, with the group's size read first,
is written (signed by the master, ``controller_records``) before Auto Scaling is asked to
stop anything, and the stop waits while it cannot be (KMS or EFS unavailable: tried again
every :data:`RETRY_SECONDS`). Written after, a record KMS could not sign would be refused by
the controller of a new master that took over before it was signed again (it cannot tell
it from a forgery), which would then forget the workers it should bring back. A successor
that finds "stopping" does not know whether the call was made: it makes it again (it is
idempotent, the recorded size is kept), or scales back if a job waits.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from bootstrap_scripts.jobs.controller.idle_master import MasterStop
from bootstrap_scripts.jobs.engine.controller_records import ControllerSeal, Trust
from bootstrap_scripts.protocol import liveness, state, store
from bootstrap_scripts.protocol.liveness import Sighting
from bootstrap_scripts.protocol.managed_records import IdleStopRecord
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat

LOG = logging.getLogger("dl-controller")
#: The stack's default (``idleStopMinutes``), in the controller's unit.
DEFAULT_IDLE_STOP_SECONDS = 3600.0
#: Seconds between two looks at the executors (and between two attempts after an AWS error).
CHECK_SECONDS = 2.0
RETRY_SECONDS = 60.0
#: Seconds between two tries to write an unchanged record that could not be written.
REWRITE_SECONDS = 10.0


class Phase(StrEnum):
    """What the controller does about idleness this turn."""

    DISABLED = "disabled"  # the setting is 0: never stop
    BUSY = "busy"  # a job runs or waits: not idle
    IDLE = "idle"  # idle, the workers stop at ``stop_at``
    STOP = "stop"  # idle long enough: stop the workers now
    STOPPING = "stopping"  # (a record's state) the size recorded, the stop maybe not made
    STOPPED = "stopped"  # stopped, nothing to run
    RESUME = "resume"  # stopped and a job waits: scale the workers back
    ADOPT = "adopt"  # stopped, but a worker started since (dl-scale by hand): not stopped


@dataclass(frozen=True)
class Decision:
    phase: Phase
    idle_since: float | None = None
    stop_at: float | None = None


def decide(*, idle_seconds: float, queued: bool, sharing: bool, idle_since: float | None,
           stopped: bool, now: float, rejoined: bool = False) -> Decision:
    """The idle-stop rule (pure). ``queued``: a managed job runs or waits; ``sharing``: a
    job share runs on a live node (an unmanaged ``dl-run`` counts); ``idle_since``: when the
    cluster was first seen idle (None: not idle before); ``stopped``: the workers were
    stopped and not brought back yet; ``rejoined``: a worker registered after the stop
    (someone ran ``dl-scale --workers N``). Only a managed job brings them back: an
    unmanaged one runs on the nodes there are (the master), so workers launched for it
    would idle."""
    if stopped:
        phase = Phase.RESUME if queued else Phase.ADOPT if rejoined else Phase.STOPPED
        return Decision(phase, idle_since)
    if idle_seconds <= 0:
        return Decision(Phase.DISABLED)
    if queued or sharing:
        return Decision(Phase.BUSY)
    since = now if idle_since is None else idle_since
    stop_at = since + idle_seconds
    return Decision(Phase.STOP if now >= stop_at else Phase.IDLE, since, stop_at)


def running_shares(efs: Path, sightings: dict[str, Sighting], now: float) -> list[str]:
    """Job ids with a share running on a node whose executor is not gone (judged by
    ``protocol.liveness`` on the caller's monotonic ``now``; ``sightings`` is updated)."""
    found: list[str] = []
    directory = ClusterPaths(efs).executors_dir
    try:
        files = sorted(p for p in directory.iterdir() if p.suffix == ".json")
    except FileNotFoundError:
        return found
    for path in files:
        beat = store.read_record_or_none(path, ExecutorHeartbeat)
        seen, sightings[path.stem] = liveness.executor(beat, sightings.get(path.stem), now)
        if beat is not None and not seen.gone:
            found.extend(beat.running)
    return found


#: Records the stop before it is made (group, desired capacity, minimum): False, no stop.
Commit = Callable[[str, int, int], bool]
#: Reads the group, calls the commit with its size, stops the workers only if it said yes;
#: returns the group's name, desired capacity and minimum before (None: not stopped).
Stopper = Callable[[Commit], tuple[str, int, int] | None]
#: Scales them back (desired, minimum before the stop); returns the new desired capacity.
Resumer = Callable[[int, int], int]


class IdleStop:
    """The controller's side: one :meth:`tick` per turn of its loop, with whether a
    managed job is queued (the turn's next job, before it runs)."""

    def __init__(self, efs: Path, *, idle_seconds: float, stop: Stopper, restore: Resumer,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 seal: ControllerSeal | None = None, master: MasterStop | None = None) -> None:
        if idle_seconds < 0:
            raise ValueError(f"--idle-stop-seconds must be >= 0, got {idle_seconds}")
        self.efs, self.idle_seconds = efs, idle_seconds
        self.stop_workers, self.restore_workers = stop, restore
        self.clock, self.monotonic = clock, monotonic
        self.master = master  # the master's own stop (None: never)
        self.master_seconds = master.master_seconds if master else 0.0
        self.sightings: dict[str, Sighting] = {}
        self.checked = -CHECK_SECONDS
        self.retry_at = 0.0
        self.rewrite_at = 0.0
        #: the record is the master's word (``controller_records``): read at the first turn
        #: (the key's public half may not be at hand yet), written signed
        self.seal = seal
        self.record = IdleStopRecord(
            state=Phase.DISABLED.value if idle_seconds <= 0 else Phase.BUSY.value,
            updated_at=self.clock(), idle_seconds=idle_seconds,
            master_seconds=self.master_seconds)
        self.written = False  # no record yet: the first turn writes one
        self.woken_checked = False  # the first turn looks for a master stop now over
        self.loaded = seal is None and self.load_unsigned()

    def load_unsigned(self) -> bool:
        found = store.read_record_or_none(self.path, IdleStopRecord)
        self.written, self.record = found is not None, found or self.record
        return True

    def load(self) -> bool:
        """Take a predecessor's record if the master signed it. Not signed (forged by root
        on a worker, or left unsigned while KMS could not sign): ignored (logged), and the
        controller starts afresh: not idle, workers not stopped, so no forged ``stop_at``
        stops them and no forged ``desired_before`` sizes them. False while KMS cannot be
        asked (the next turn looks again)."""
        if self.seal is None:
            return self.load_unsigned()
        found = self.seal.read(self.path, IdleStopRecord, "idle-stop record")
        if found.trust is Trust.UNCHECKED:
            return False
        if found.trust is Trust.SIGNED and isinstance(found.record, IdleStopRecord):
            self.record, self.written = found.record, True
        return True

    @property
    def path(self) -> Path:
        return ClusterPaths(self.efs).idle_stop

    @property
    def stopped(self) -> bool:
        return self.record.stopped_at is not None

    def save(self, **changes: object) -> bool:
        """Record ``changes``; False when they are only in memory (EFS full or gone, KMS
        unable to sign: written at a later turn). Only signed records are written, so the
        one on EFS stays the master's last word a successor can trust."""
        new = dataclasses.replace(self.record, **changes, updated_at=self.clock(),
                                  idle_seconds=self.idle_seconds,
                                  master_seconds=self.master_seconds)
        same = dataclasses.replace(new, updated_at=0.0) == dataclasses.replace(
            self.record, updated_at=0.0)
        if same and self.written:
            return True  # nothing changed: no write every turn
        if same and self.monotonic() < self.rewrite_at:
            return False  # not written a moment ago: no KMS call and warning every turn
        try:
            if self.seal is not None:
                done = self.seal.write_signed(self.path, new)
            else:
                store.write_record(self.path, new)
                done = True
        except OSError as exc:  # EFS full or gone for a moment: jobs must not wait on this
            LOG.warning("idle stop: cannot write %s: %s (kept in memory)", self.path, exc)
            done = False
        self.record, self.written = new, done
        self.rewrite_at = self.monotonic() + (0.0 if done else REWRITE_SECONDS)
        return done

    def tick(self, *, queued: bool) -> None:
        """Look at the cluster (every :data:`CHECK_SECONDS`; at once when a job is queued)
        and act on :func:`decide`."""
        mono = self.monotonic()
        if not queued and mono - self.checked < CHECK_SECONDS:
            return
        if not self.loaded:
            self.loaded = self.load()
            if not self.loaded:
                return
        if not self.woken_checked:
            self.woken_checked = True
            self.woken()
        self.checked = mono
        try:
            sharing = not queued and bool(running_shares(self.efs, self.sightings, mono))
        except OSError as exc:  # EFS unreadable for a moment: decide at the next look
            LOG.warning("idle stop: cannot read the executors' heartbeats: %s", exc)
            return
        d = decide(idle_seconds=self.idle_seconds, queued=queued, sharing=sharing,
                   idle_since=self.record.idle_since, stopped=self.stopped, now=self.clock(),
                   rejoined=self.stopped and not queued and self.worker_started_since())
        if d.phase is Phase.RESUME:
            self.resume()
        elif d.phase is Phase.ADOPT:
            self.resume(by_hand=True)
        elif d.phase is Phase.STOP:
            self.stop(d)
        elif d.phase is Phase.STOPPED and self.record.state == Phase.STOPPING.value:
            if not sharing:  # a predecessor's stop, maybe never made: make it (idempotent)
                self.stop(d)
        elif d.phase is Phase.STOPPED:
            self.save()  # writes only a record EFS had no room (or KMS no signature) for
            self.master_turn(sharing)
        else:
            self.save(state=d.phase.value, idle_since=d.idle_since, stop_at=d.stop_at)

    def stop(self, d: Decision) -> None:
        """Stop the workers, the "stopping" record (with the size to restore) written
        first; or finish a predecessor's (its record kept: the group may read 0 by now)."""
        if self.monotonic() < self.retry_at:
            return
        finishing = self.stopped and self.record.state == Phase.STOPPING.value

        def commit(group: str, desired: int, minimum: int) -> bool:
            if finishing:
                return True
            return self.save(state=Phase.STOPPING.value, idle_since=d.idle_since,
                             stop_at=d.stop_at, stopped_at=self.clock(), group=group,
                             desired_before=desired, min_before=minimum, resumed_at=None,
                             message=f"stopping workers {desired} -> 0")

        try:
            made = self.stop_workers(commit)
        except Exception as exc:  # AWS refused or is unreachable: say so, try again later
            self.retry_at = self.monotonic() + RETRY_SECONDS
            LOG.error("idle stop: could not stop the workers: %s (again in %.0f s)", exc,
                      RETRY_SECONDS)
            if finishing:  # the workers may be stopped: the record keeps what to restore
                self.save(message=f"stop failed: {exc}"[:500])
            else:
                self.save(state=Phase.IDLE.value, idle_since=d.idle_since, stop_at=d.stop_at,
                          stopped_at=None, message=f"stop failed: {exc}"[:500])
            return
        if made is None:  # the record could not be written (signed): no stop without it
            self.retry_at = self.monotonic() + RETRY_SECONDS
            LOG.error("idle stop: the stop could not be recorded (signed) first, so the "
                      "workers are not stopped now (again in %.0f s)", RETRY_SECONDS)
            self.record = dataclasses.replace(
                self.record, state=Phase.IDLE.value, stopped_at=None,
                message="stop failed: it could not be recorded first (KMS or EFS)")
            self.written = False
            return
        group, desired, _ = made
        if finishing:
            desired = self.record.desired_before
        LOG.info("idle stop: idle since %s: worker group %s %d -> 0 (each drained first)",
                 time.ctime(d.idle_since or 0), group, desired)
        self.save(state=Phase.STOPPED.value,
                  message=f"workers {desired} -> 0 after {self.idle_seconds:.0f} s idle")

    def woken(self) -> None:
        """A predecessor master asked for its own release: this controller runs on the
        master that ``dlc`` woke (or on a replacement), so that stop is over."""
        rec, me = self.record, self.master.instance_id if self.master else ""
        if rec.master_stopped_at is not None and rec.master_instance != me:
            LOG.info("idle stop: master %s stopped at %s; %s runs now", rec.master_instance,
                     time.ctime(rec.master_stopped_at), me or "this master")
            self.save(master_stopped_at=None, master_instance="",
                      message=f"master woken (stopped at {time.ctime(rec.master_stopped_at)})")

    def master_turn(self, sharing: bool) -> None:
        """The workers are stopped: stop the master too when ``idle_master.may_stop`` says
        so, the request recorded first (a successor then knows it was asked for)."""
        m = self.master
        if m is None or self.monotonic() < self.retry_at:
            return
        if self.record.master_stopped_at is not None:  # asked already: this master lives on
            if self.record.master_instance == m.instance_id and m.due_again():
                self.send_master_request()
            return
        v = m.verdict(workers_stopped_at=self.record.stopped_at
                      if self.record.state == Phase.STOPPED.value else None, sharing=sharing)
        m.note(v)
        if not v.stop:
            return
        if not self.save(master_stopped_at=self.clock(), master_instance=m.instance_id,
                         message="master stopping"):
            self.retry_at = self.monotonic() + RETRY_SECONDS
            self.record = dataclasses.replace(self.record, master_stopped_at=None,
                                              master_instance="")
            return
        self.send_master_request()

    def send_master_request(self) -> None:
        assert self.master is not None
        try:
            group = self.master.send()
        except Exception as exc:  # AWS refused or is unreachable: not stopped, try again
            self.retry_at = self.monotonic() + RETRY_SECONDS
            LOG.error("idle stop: could not ask for the master's release: %s (again in "
                      "%.0f s)", exc, RETRY_SECONDS)
            self.save(master_stopped_at=None, master_instance="",
                      message=f"master stop failed: {exc}"[:500])
            return
        self.save(message=f"master group {group} -> 0 (released by the capacity adjuster)")

    def worker_started_since(self) -> bool:
        """A worker's agent started after the stop (its registration says when)."""
        at = self.record.stopped_at or 0.0
        return any(r.role == "worker" and r.started_at > at
                   for r in state.read_registrations(self.efs).values())

    def resume(self, *, by_hand: bool = False) -> int:
        """Scale the workers back to their size before the stop (a job is queued); or,
        ``by_hand`` (someone started workers since), keep the size they have and put the
        group's minimum back. Returns the worker count asked for (0: not stopped, or the
        call failed: retried at a later tick)."""
        if not self.stopped or self.monotonic() < self.retry_at:
            return 0
        try:
            target = self.restore_workers(0 if by_hand else self.record.desired_before,
                                          self.record.min_before)
        except Exception as exc:
            self.retry_at = self.monotonic() + CHECK_SECONDS * 5
            LOG.error("idle stop: could not scale the workers back: %s", exc)
            self.save(message=f"resume failed: {exc}"[:500])
            return 0
        why = "started by hand" if by_hand else "for a job"
        LOG.info("idle stop: worker group %s back to %d (%s)", self.record.group, target, why)
        self.save(state=Phase.BUSY.value, idle_since=None, stop_at=None, stopped_at=None,
                  resumed_at=self.clock(), message=f"workers 0 -> {target} {why}")
        return target


def worker_group_actions(root: Path, efs: Path, client: Callable[[], Any]
                         ) -> tuple[Stopper, Resumer]:
    """The two AWS actions, through ``dl-scale``'s own code (``ops.scale``): the worker
    group found by the cluster's tags, ``client()`` the controller's Auto Scaling client."""
    from bootstrap_scripts.ops import scale

    def stop(commit: Commit) -> tuple[str, int, int] | None:
        cluster = scale.load_cluster(str(root), str(efs), client())
        g = cluster.worker_group
        if not commit(cluster.group_name, int(g["DesiredCapacity"]), int(g["MinSize"])):
            return None
        desired, minimum = scale.stop_all_workers(cluster, client())
        return cluster.group_name, desired, minimum

    def restore(desired: int, minimum: int) -> int:
        cluster = scale.load_cluster(str(root), str(efs), client())
        return scale.restore_workers(cluster, client(), desired=desired, minimum=minimum)

    return stop, restore

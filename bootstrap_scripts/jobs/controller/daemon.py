"""The job controller: runs managed jobs one at a time and restarts them after faults.

``python3 -m bootstrap_scripts.jobs.controller --root / --mount-point /efs --region R``
(systemd unit ``dl-controller.service``, on the master only).

Why a service and not ``dl-run`` itself: a job followed by the user's ``dl-run`` dies with
the user's session or with the master; a job owned by a service whose whole state is on EFS
outlives both. ``dl-run`` only submits (``managed/<id>/request.json``) and follows the logs.

What it does, every half second:
- its heartbeat, ``cluster/controller.json`` (``dl-jobs`` says whether a controller is alive);
- at start, jobs left ``running`` by a controller that is gone (this master was replaced, or
  the controller was killed): their orphaned attempt is cancelled through its cancel file
  (the executors stop its shares at once rather than after the orphan timeout), a
  ``master-lost`` restart is recorded, and the job restarts from its checkpoint under the
  same id; a job left ``restarting`` simply continues;
- then the queue, first come first served: one job at a time (``supervise.JobSupervisor``);
  a request that cannot be read fails its job, saying why (it never silently disappears).
At start, jobs left ``running`` whose attempt is still going (its runner's heartbeat moves:
the controller was killed or restarted, the runner was not) are re-attached: followed to
their end as if nothing happened, no restart.
One controller per node: an exclusive lock (``single_instance``) in the node's state
directory; a second one exits 1 naming the holder.
EFS full (ENOSPC) never stops the controller: the job it could not record is failed with
"EFS full" in its record, written as soon as there is space again.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import socket
import time
from pathlib import Path

from bootstrap_scripts.jobs.controller import (
    attempts,
    idle,
    idle_master,
    instance_health,
    retention,
    sealed,
)
from bootstrap_scripts.jobs.controller.efs_full import UnwrittenRecords
from bootstrap_scripts.jobs.controller.engine_facts import EngineFacts
from bootstrap_scripts.jobs.controller.hangs import HangWatch
from bootstrap_scripts.jobs.controller.instance_health import InstanceHealth
from bootstrap_scripts.jobs.controller.metrics import ControllerMetrics, unhealthy_nodes
from bootstrap_scripts.jobs.controller.supervise import Gate, JobSupervisor
from bootstrap_scripts.jobs.controller.takeover import POLL_SECONDS, Takeover
from bootstrap_scripts.jobs.engine import managed, root_jobs
from bootstrap_scripts.jobs.engine.controller_records import ControllerSeal, read_job, trusted_job
from bootstrap_scripts.jobs.engine.node_env import read_node_env
from bootstrap_scripts.jobs.engine.restart_policy import JobState
from bootstrap_scripts.jobs.engine.userfiles import UnsafeUserFile
from bootstrap_scripts.node import single_instance
from bootstrap_scripts.node.procgroup import alive
from bootstrap_scripts.ops.prices import PriceBook
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import (
    ControllerHeartbeat,
    ManagedJob,
    ManagedRequest,
)
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths, ManagedPaths, NodePaths

LOG = logging.getLogger("dl-controller")
HEARTBEAT_SECONDS = 1.0
#: seconds between two passes archiving finished jobs past their retention
ARCHIVE_EVERY = 3600.0


class ControllerError(RuntimeError):
    """The controller cannot run (another one is alive here); the message says which."""


def lock_path(root: Path) -> Path:
    """The controller's lock file, in the node's state directory (next to the agent's)."""
    return NodePaths(root).lock("dl-controller")


class Controller(Takeover):
    """The service (module doc); its take-over of a predecessor's jobs is ``Takeover``'s."""

    def __init__(self, root: Path, efs: Path, *, region: str = "",
                 gate: Gate | None = None, health: InstanceHealth | None = None,
                 retention_days: float = retention.DEFAULT_RETENTION_DAYS,
                 max_replacements: int = instance_health.DEFAULT_MAX_REPLACEMENTS_PER_HOUR,
                 idle_seconds: float = 0.0, checkpoints_url: str = "",
                 master_seconds: float = 0.0, release_function: str = "") -> None:
        self.root, self.efs = root, efs
        #: root's requests start only with the master's signature (``root_jobs``)
        self.verify_root = root_jobs.verifier(root)
        #: the controller's own records, signed by the master (``controller_records``)
        self.seal = ControllerSeal.for_node(root, LOG)
        self.checkpoints_url = checkpoints_url
        self.retention_days = retention_days
        self.archived_at = 0.0
        self.gate = gate
        self.health = health or InstanceHealth(region, max_per_hour=max_replacements)
        #: every job's nodes priced for its cost ledger (``ops/prices``; AWS asked lazily)
        self.prices = PriceBook(efs, region)
        self.stopping = False
        self.seq = 0
        self.last_beat = 0.0
        self.started_at = time.time()
        self.job_id = ""
        self.sup: JobSupervisor | None = None  # the job running now (its restart count)
        self.watched: HangWatch | None = None  # the attempt whose progress metrics go out
        self.metrics = ControllerMetrics(root, self.cluster_id)
        #: nodes joined, queue, cost: the cluster line's
        self.facts = EngineFacts(root, efs, seal=self.seal)
        env = read_node_env(NodePaths(root))
        self.address = env.get("DEEPLEARNING_NODE_ADDR", "")
        self.instance_id = env.get("DEEPLEARNING_INSTANCE_ID", "")
        if not self.instance_id and self.address:
            try:
                node = Membership.load(NodePaths(root).membership).node_by_address(self.address)
                self.instance_id = node.instance_id if node else ""
            except (OSError, ValueError):
                pass
        self.me = f"{self.instance_id or socket.gethostname()}/{os.getpid()}"
        #: job records EFS had no space for (ENOSPC): written once it has again
        self.pending_records = UnwrittenRecords(efs, self.me, self.seal)
        self.breaker = sealed.BreakerBook(self.seal, efs, self.me)
        stop, restore = idle.worker_group_actions(root, efs, self.health.client)
        master = None
        if idle_seconds and master_seconds and release_function:  # idle_master's doc
            groups, request = idle_master.master_actions(release_function, region,
                                                         self.cluster_id)
            master = idle_master.MasterStop(master_seconds=master_seconds,
                                            instance_id=self.instance_id, groups=groups,
                                            request=request)
        self.idle = idle.IdleStop(efs, idle_seconds=idle_seconds, stop=stop, restore=restore,
                                  seal=self.seal, master=master)

    def cluster_id(self) -> str:
        """The cluster's id, from the membership this node applied ("" before there is one)."""
        try:
            return Membership.load(NodePaths(self.root).membership).cluster_id
        except (OSError, ValueError):
            return ""

    def unhealthy_nodes(self) -> int:
        """``UnhealthyNodes`` (``metrics.unhealthy_nodes``): the members this controller
        marked Unhealthy or the running job excluded; the membership is read only when
        some instance is flagged."""
        marked = self.health.marked_instances()
        excluded = self.sup.job.excluded if self.sup else ()
        if not marked and not excluded:
            return 0
        try:
            m = Membership.load(NodePaths(self.root).membership)
        except (OSError, ValueError):
            return 0
        return unhealthy_nodes((n.instance_id for n in m.nodes), marked, excluded)

    # -- heartbeat -------------------------------------------------------------------------
    def beat(self, state: str = "running", *, force: bool = False) -> None:
        if not force and time.monotonic() - self.last_beat < HEARTBEAT_SECONDS:
            return
        self.seq += 1
        self.last_beat = time.monotonic()
        try:
            store.write_record(ClusterPaths(self.efs).controller_heartbeat, ControllerHeartbeat(
                pid=os.getpid(), heartbeat=time.time(), seq=self.seq, state=state,
                hostname=socket.gethostname(), instance_id=self.instance_id,
                address=self.address, started_at=self.started_at, job_id=self.job_id,
                replacements=self.health.recent_marks()))
        except OSError as exc:
            LOG.error("cannot write the controller heartbeat: %s", exc)
        self.breaker.save(self.health.recent_marks())
        self.seal.retry()
        self.observe()
        if self.sup is not None and self.sup.watch is not None:  # StepTime, Loss, ...
            if self.watched is not None and self.watched is not self.sup.watch:
                self.last_progress(self.job_id, self.watched)  # the previous attempt's
            self.watched = self.sup.watch
            self.metrics.observe_progress(self.job_id, self.sup.watch.records)

    def observe(self, *, final: bool = False) -> None:
        """The cluster line (``metrics.ControllerMetrics.observe``): JobsRunning,
        JobRestarts, UnhealthyNodes and the engine's facts; ``final``: the job ended."""
        self.metrics.observe(job_id=self.job_id, restarts=self.sup.job.restarts if self.sup
                             else 0, unhealthy=self.unhealthy_nodes(), final=final,
                             facts=self.facts.now(self.sup.job if self.sup else None))

    def last_progress(self, job_id: str, watch: HangWatch) -> None:
        """An ended attempt's last figures (``metrics.ControllerMetrics.observe_progress``,
        ``final``): its ranks' files read once more, as their user, for the steps reported
        since the last look."""
        if watch.uid >= 0:
            watch.read()
        self.metrics.observe_progress(job_id, watch.records, final=True)

    def wait_key(self) -> None:
        """Fetch the membership key's public half before reading any record of a
        predecessor: while KMS cannot be asked, nothing is concluded (retried, logged)."""
        while not self.stopping and not self.seal.ready():
            self.beat("waiting")
            time.sleep(POLL_SECONDS * 4)

    def adopt_marks(self) -> None:
        """The breaker keeps counting across controllers, from the marks the master signed
        (``cluster/breaker.json``; the heartbeat's copy is for display, unsigned)."""
        self.health.marks = sorted({*self.health.marks, *self.breaker.load()})

    def check_alone(self) -> None:
        """Refuse to run beside a live controller on this instance (its heartbeat fresh and
        its process alive). One on another instance is a previous master's: gone."""
        hb = store.read_record_or_none(ClusterPaths(self.efs).controller_heartbeat,
                                       ControllerHeartbeat)
        if hb is None or hb.pid == os.getpid():
            return
        if hb.state == "stopped":
            return
        fresh = time.time() - hb.heartbeat < managed.CONTROLLER_TIMEOUT
        if fresh and hb.instance_id == self.instance_id and hb.hostname == \
                socket.gethostname() and alive(hb.pid):
            raise ControllerError(f"another job controller is running here (pid {hb.pid}, "
                                  f"heartbeat {ClusterPaths(self.efs).controller_heartbeat})")

    # -- jobs --------------------------------------------------------------------------------
    def supervisor(self, paths: ManagedPaths, request: ManagedRequest,
                   job: ManagedJob) -> JobSupervisor:
        return JobSupervisor(root=self.root, efs=self.efs, paths=paths, request=request,
                             job=job, health=self.health, gate=self.gate, tick=self.beat,
                             stopping=lambda: self.stopping, prices=self.prices,
                             checkpoints_url=self.checkpoints_url, seal=self.seal)

    def run_job(self, sup: JobSupervisor, *, reattach: bool = False) -> None:
        self.job_id, self.sup = sup.job.job_id, sup
        self.beat(force=True)
        try:
            sup.run(reattach=reattach)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                self.fail(sup, exc)
            else:
                self.pending_records.fail(sup.paths, sup.job, exc)
        except (attempts.AttemptError, ValueError) as exc:
            self.fail(sup, exc)
        finally:
            if sup.watch is not None:
                self.last_progress(sup.job.job_id, sup.watch)
            self.observe(final=True)  # the job's last attempts and cost
            LOG.info("event=controller-records-signed job=%s signs=%d (kms:Sign calls for "
                     "the controller's records since it started)", sup.job.job_id,
                     self.seal.signs)
            self.job_id, self.sup, self.watched = "", None, None

    def fail(self, sup: JobSupervisor, exc: Exception) -> None:
        LOG.exception("job %s: %s", sup.job.job_id, exc)
        if not JobState(sup.job.state).terminal:
            try:
                sup.finish(JobState.FAILED, f"the job controller could not run it: {exc}")
            except OSError as again:
                self.pending_records.fail(sup.paths, sup.job, again)

    def next_job(self) -> JobSupervisor | None:
        """The oldest queued job, as a supervisor (cancelled ones are closed on the way,
        and so are those whose request cannot be read: failed, saying why)."""
        for paths, problem in managed.unusable_queued(self.efs, self.verify_root):
            if paths.key in self.pending_records:
                continue
            job = dataclasses.replace(managed.unusable(paths, problem), controller=self.me,
                                      finished_at=time.time())
            LOG.error("job %s: %s", job.job_id, job.message)
            try:  # written as the job directory's owner, like every record of the job
                managed.save_job(paths, job)
            except UnsafeUserFile as exc:  # the directory was replaced by a link meanwhile
                LOG.error("job %s: no record written: %s", job.job_id, exc)
            except OSError as exc:
                self.pending_records.fail(paths, job, exc)
        for paths, request in managed.queue(self.efs, self.verify_root, self.seal):
            if paths.key in self.pending_records:
                continue
            job = trusted_job(read_job(self.seal, self.efs, paths.key)) or ManagedJob(
                job_id=request.job_id, state=JobState.QUEUED.value,
                submitted_at=request.submitted_at, user=request.user,
                world_size=request.world_size, max_cost_usd=request.max_cost_usd)
            sup = self.supervisor(paths, request, job)
            try:
                sup.update(controller=self.me)
                if managed.cancel_requested(paths):
                    sup.finish(JobState.CANCELLED, managed.CANCELLED_BEFORE_START)
                    continue
                problem = self.refuse(paths)
                if problem:
                    sup.finish(JobState.FAILED, problem)
                    continue
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                self.pending_records.fail(paths, sup.job, exc)
                continue
            return sup
        return None

    def refuse(self, paths: ManagedPaths) -> str:
        """Why this controller must not run the job ("" if it may)."""
        try:
            uid, _gid = attempts.owner(paths.request)
            dir_uid, _ = attempts.owner(paths.dir)
        except UnsafeUserFile as exc:  # a link planted in the user's directory
            return str(exc)
        if uid != dir_uid:
            return (f"{paths.request} belongs to uid {uid} but {paths.dir} to uid {dir_uid}: "
                    f"refusing to run it")
        if os.geteuid() != 0 and uid != os.geteuid():
            return (f"the job controller runs as uid {os.geteuid()} and cannot run a job "
                    f"submitted by uid {uid}")
        return ""

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> int:
        try:
            lock = single_instance.acquire(lock_path(self.root))
        except (single_instance.AlreadyRunning, single_instance.UnsafeLockFile) as exc:
            raise ControllerError(f"another job controller is running on this node: "
                                  f"{exc}") from None
        try:
            self.check_alone()
            self.wait_key()
            self.adopt_marks()
            LOG.info("job controller %s: root %s, EFS %s, health gate %s", self.me,
                     self.root, self.efs, "on" if self.gate else "not installed")
            self.beat(force=True)
            self.recover()
            while not self.stopping:
                if not self.step():
                    time.sleep(POLL_SECONDS)
            self.beat("stopped", force=True)
            return 0
        finally:
            lock.release()

    def step(self) -> bool:
        """One turn of the loop; True when it ran a job. An error of EFS (full, gone for a
        moment) is logged and the loop goes on: the controller outlives it."""
        try:
            self.beat()
            self.pending_records.flush()
            if time.monotonic() - self.archived_at > ARCHIVE_EVERY or not self.archived_at:
                self.archived_at = time.monotonic()
                retention.archive_finished(self.efs, days=self.retention_days, seal=self.seal)
            sup = self.next_job()
            self.idle.tick(queued=sup is not None)  # a queued job brings stopped workers back
            if sup is None:
                return False
            self.run_job(sup)
            return True
        except OSError as exc:
            LOG.error("job controller: %s (carrying on)", exc)
            return False

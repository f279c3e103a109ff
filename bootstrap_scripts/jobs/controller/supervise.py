"""Running one managed job to its end: pick the nodes, gate them, run attempts, restart.

The controller (``controller.py``) hands a job to :class:`JobSupervisor`, which loops:

1. **Nodes.** The membership's nodes, minus the instances the job excluded (failed ones),
   minus nodes whose executor is not alive. Fewer than the first attempt's count: wait for
   Auto Scaling's replacement up to ``--replace-timeout``, then run on the survivors if
   they are at least ``--min-nodes`` (``restart_policy.choose_world``). An ``--elastic``
   job runs on the survivors at once and lets the replacement join that attempt once it
   passed the health gate (``rejoin.py``); a node lost meanwhile is marked Unhealthy at once
   (``elastic_attempt.py``).
2. **Health gate** on those nodes (``ops.gate.run_gate``): a failing node is marked
   Unhealthy (Auto Scaling replaces it) and excluded, and the choice starts again.
3. **Attempt** ``n``: ``jobs/<id>.<n>/`` run by today's engine (``attempts.py``), as the
   user who submitted the job, with ``DL_CHECKPOINT_DIR`` / ``DL_RESTART_COUNT`` /
   ``DL_RESUME``, followed while it runs (``running_attempt.py``): a user's cancel is
   passed on to its cancel file at once; its ranks' progress is watched (``hangs.py``):
   stragglers go into the job's record, and an attempt with no progress for
   ``--hang-timeout`` has its stacks dumped and is stopped (``hang``).
4. **Decision** (``restart_policy.decide``) on how it ended: done, or a restart record
   (kind, node, instance, checkpoint resumed from, seconds to resume) and a node fault's
   instance marked Unhealthy when root's own record confirms it (``node_evidence``: the
   node's executor heartbeat lost; never the master; within the cluster's circuit breaker,
   ``instance_health.breaker``), then back to 1.

A user's cancel is final: looked at before the gate, after it and before an attempt is spawned.

Every attempt is entered in the job's cost ledger (``budget.py``); with ``--max-cost`` the
job is stopped like a cancel once the ledger reaches the cap, and ends ``budget``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from bootstrap_scripts.jobs.controller import (
    attempts,
    hangs,
    node_evidence,
    node_heartbeats,
    rejoin,
)
from bootstrap_scripts.jobs.controller.budget import JobBudget
from bootstrap_scripts.jobs.controller.instance_health import InstanceHealth
from bootstrap_scripts.jobs.controller.running_attempt import POLL_SECONDS, RunningAttempt
from bootstrap_scripts.jobs.engine import checkpoints, managed, userfiles
from bootstrap_scripts.jobs.engine.classify import (
    Failure,
    FailureClass,
    FailureKind,
    budget_stop,
)
from bootstrap_scripts.jobs.engine.controller_records import ControllerSeal, write_job
from bootstrap_scripts.jobs.engine.reachability import Executors
from bootstrap_scripts.jobs.engine.restart_policy import (
    Action,
    JobState,
    Policy,
    World,
    WorldChoice,
    check_transition,
    choose_world,
    decide,
)
from bootstrap_scripts.jobs.engine.run import nodes_membership
from bootstrap_scripts.ops.prices import PriceBook
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest, RestartRecord
from bootstrap_scripts.protocol.membership import Membership, Node
from bootstrap_scripts.protocol.nnodes import requested_minimum
from bootstrap_scripts.protocol.paths import ClusterPaths, ManagedPaths, NodePaths

LOG = logging.getLogger("dl-controller")
# POLL_SECONDS (running_attempt's): a wait for nodes looks again at the attempt's pace

#: ``gate(root, efs, membership, addresses)`` -> [(address, instance_id, why)] of failing
#: nodes (see :func:`controller.entry.health_gate`).
Gate = Callable[[Path, Path, Membership, list[str]], list[tuple[str, str, str]]]


class JobSupervisor(RunningAttempt):
    def __init__(self, *, root: Path, efs: Path, paths: ManagedPaths, request: ManagedRequest,
                 job: ManagedJob, health: InstanceHealth, gate: Gate | None,
                 tick: Callable[[], None], stopping: Callable[[], bool],
                 prices: PriceBook | None = None, checkpoints_url: str = "",
                 seal: ControllerSeal | None = None) -> None:
        self.root, self.efs, self.paths, self.request = root, efs, paths, request
        #: signs the controller's own copy of the record (``controller_records``)
        self.seal = seal
        #: the cluster's checkpoint prefix in S3 ("" for none): attempts mirror under it
        self.checkpoints_url = checkpoints_url
        self.job = job
        self.health, self.gate = health, gate
        self.tick, self.stopping = tick, stopping
        self.policy = Policy(max_restarts=request.max_restarts, min_nodes=request.min_nodes,
                             max_code_restarts=request.max_code_restarts,
                             replace_timeout=request.replace_timeout,
                             elastic=request.run.elastic,
                             elastic_min=requested_minimum(request.run.nnodes))
        #: how the current attempt's nodes were chosen; its late joiners (elastic)
        self.choice: WorldChoice | None = None
        self.rejoin: rejoin.Rejoin | None = None
        try:
            self.uid, self.gid = attempts.owner(paths.request)
        except userfiles.UnsafeUserFile:  # the controller's ``refuse`` fails the job with why
            self.uid = self.gid = -1
        #: instance ids of the previous attempt's nodes (a new one there is a replacement)
        self.last_nodes: set[str] = set()
        self.last_nodes_addresses: set[str] = set()
        #: the executors as this supervisor has seen them (the cluster's one liveness rule)
        self.executors = Executors(efs, read=node_heartbeats.reader(root))
        #: the cost ledger and --max-cost (a cap that is not one: the job fails naming it)
        self.budget = JobBudget(request, prices)
        #: how a hung attempt's stacks are dumped (``ops.hang_stacks``; tests give their own)
        self.dump_stacks: hangs.Dumper = self.dump_stacks_on_nodes
        #: the current attempt's ``hang`` failure once the watch judged it hung
        self.hang: Failure | None = None
        self.watch: hangs.HangWatch | None = None  # the attempt's progress (job metrics too)

    # -- the record ----------------------------------------------------------------------
    def update(self, **changes: object) -> ManagedJob:
        if "state" in changes:
            check_transition(JobState(self.job.state), JobState(str(changes["state"])))
        with userfiles.as_user(self.uid, self.gid):  # the user's directory, as the user
            self.job = managed.save_job(self.paths, dataclasses.replace(self.job, **changes))
        if self.seal is not None:  # the copy a successor trusts, root's, signed
            write_job(self.seal, self.efs, self.paths.key, self.job)
        return self.job

    def update_last_restart(self, **changes: object) -> None:
        if self.job.restart_log:
            *older, last = self.job.restart_log
            self.update(restart_log=(*older, dataclasses.replace(last, **changes)))

    def finish(self, state: JobState, message: str) -> ManagedJob:
        LOG.info("job %s %s: %s", self.job.job_id, state.value, message)
        return self.update(state=state.value, message=message, finished_at=time.time())

    # -- 1. nodes ------------------------------------------------------------------------
    def ready_nodes(self) -> tuple[Membership | None, list[Node], bool]:
        """The membership, its nodes ready for an attempt (executor seen alive, not
        excluded), and whether any node is still undecided (its executor not yet seen to
        move nor silent long enough to be gone: a second more tells). (None, [], False)
        while this node has no membership yet (a new master whose agent has not formed the
        cluster)."""
        try:
            m = Membership.load(NodePaths(self.root).membership)
        except (OSError, ValueError) as exc:
            LOG.debug("no membership yet: %s", exc)
            return None, [], False
        candidates = [n for n in m.nodes if n.instance_id not in self.job.excluded]
        alive = set(self.executors.alive(n.address for n in candidates))
        gone = self.executors.gone(n.address for n in candidates if n.address not in alive)
        ready = [n for n in candidates if n.address in alive]
        undecided = len(ready) + len(gone) < len(candidates)
        if m.master not in ready:  # the master runs the rendezvous store / mpirun
            return m, [], undecided
        return m, ready, undecided

    def choose_nodes(self) -> tuple[Membership, list[Node]] | None:
        """The nodes of the next attempt, after the health gate; None: the job ended
        (failed for want of nodes, or cancelled while waiting)."""
        waited_since = time.monotonic()
        announced = ""
        while True:
            m, ready, undecided = self.ready_nodes()
            if m is None or (undecided and len(ready) < (
                    self.job.full_size or self.request.world_size or len(m.nodes))):
                if managed.cancel_requested(self.paths) or self.stopping():
                    return None
                self.tick()
                time.sleep(POLL_SECONDS)
                continue
            if not self.job.full_size:
                # The job's size is the cluster's when it was submitted (or, failing that,
                # when first chosen), before the gate excludes anyone: a node the gate fails
                # is then waited for (Auto Scaling replaces it) rather than silently
                # shrinking the job.
                self.update(full_size=self.request.world_size or len(m.nodes))
            full = self.job.full_size
            choice = choose_world(full_size=full, ready=len(ready),
                                  waited=time.monotonic() - waited_since, policy=self.policy)
            if choice.world is World.FAIL:
                self.finish(JobState.FAILED, choice.reason)
                return None
            if choice.world is not World.WAIT:
                if managed.cancel_requested(self.paths):
                    return None  # cancelled while restarting: no gate, no attempt
                failing = self.run_gate(m, ready)
                if managed.cancel_requested(self.paths):
                    return None  # cancelled while the gate ran
                if not failing:
                    if choice.world is not World.FULL:
                        LOG.info("job %s: %s", self.job.job_id, choice.reason)
                    self.choice = choice
                    return m, ready
                continue  # excluded and marked: choose again (replacements may come)
            if choice.reason != announced:
                LOG.info("job %s: %s", self.job.job_id, choice.reason)
                announced = choice.reason
            if managed.cancel_requested(self.paths) or self.stopping():
                return None
            self.tick()
            time.sleep(POLL_SECONDS)

    # -- 2. health gate --------------------------------------------------------------------
    def run_gate(self, m: Membership, nodes: list[Node]) -> list[str]:
        """Gate ``nodes``; mark Unhealthy and exclude each failing node the evidence names
        (``node_evidence.gate_verdicts``: never the master, never a node for a collective
        that failed on several). Returns every failing address (the choice starts again)."""
        if self.gate is None:
            return []
        failures = self.gate(self.root, self.efs, m, [n.address for n in nodes])
        failing = {a for a, _i, _w in failures}
        decided = node_evidence.gate_verdicts(
            [(a, i or (m.node_by_address(a).instance_id if m.node_by_address(a) else ""), w)
             for a, i, w in failures],
            master_instance=m.master.instance_id, master_address=m.master.address,
            passed=sum(1 for n in nodes if n.address not in failing))
        for v in decided:
            err = self.health.mark_unhealthy(v.instance_id) if v.mark else v.note
            LOG.warning("job %s: node %s (%s) failed the health gate: %s%s", self.job.job_id,
                        v.address, v.instance_id, v.why, f" [{err}]" if err else "")
            self.update(excluded=tuple(sorted({*self.job.excluded, v.instance_id}))
                        if v.mark else self.job.excluded,
                        last_failure=f"node-unhealthy: {v.address} ({v.instance_id}): {v.why}"
                        + (f" [{err}]" if err else ""),
                        gate_failures=(*self.job.gate_failures,
                                       f"{v.address} ({v.instance_id}): {v.why}"
                                       + (f" [{v.note}]" if v.note else "")))
        return [a for a, _i, _w in failures]

    def membership(self) -> Membership | None:
        """The nodes of the current attempt (its copy, else the live membership)."""
        for path in (self.paths.attempt_membership(self.job.attempt),
                     NodePaths(self.root).membership):
            try:
                return Membership.load(path)
            except (OSError, ValueError):
                continue
        return None

    def attempt_membership(self, m: Membership, nodes: list[Node], n: int) -> Path:
        """Attempt ``n`` runs on exactly ``nodes``, the ones chosen and gated: a copy of the
        membership with only them (same generation, ranks renumbered) under
        ``attempts/<n>.membership.json``. Always a copy, never the live file: the live one
        may change between the choice and the runner reading it (a replacement joining
        while the gate runs), and the attempt must not run on a node nobody gated."""
        sub = nodes_membership(m, nodes, reason=f"job {self.job.job_id} attempt {n}: "
                               f"{len(nodes)} of {len(m.nodes)} node(s)")
        path = self.paths.attempt_membership(n)
        with userfiles.as_user(self.uid, self.gid):  # in the user's directory, as the user
            store.atomic_write(path, sub.to_json())
        return path

    # -- 3. one attempt ----------------------------------------------------------------------
    def run_attempt(self, m: Membership, nodes: list[Node]) -> tuple[Failure | None, float]:
        n = self.job.attempt + 1
        attempt_id = self.paths.attempt_id(n)
        argv = attempts.runner_argv(root=str(self.root), efs=self.efs,
                                    membership=self.attempt_membership(m, nodes, n))
        user = userfiles.user_name(self.uid)
        run = attempts.attempt_request(self.request, attempt_id=attempt_id, efs=self.efs,
                                       restart_count=self.job.restarts, user=user,
                                       checkpoints_url=self.checkpoints_url)
        if self.job.restart_log:
            with userfiles.as_user(self.uid, self.gid):  # the user's file, the user's rights
                epoch, step = checkpoints.checkpoint_position(
                    Path(attempts.checkpoint_dir(self.efs, self.job.job_id, user)))
            new = [x.instance_id for x in nodes
                   if self.last_nodes and x.instance_id not in self.last_nodes]
            self.update_last_restart(next_world_size=len(nodes), resumed_epoch=epoch,
                                     resumed_step=step,
                                     replacement_instance_id=",".join(new),
                                     world=self.choice.world.value if self.choice else "",
                                     full_size=self.job.full_size)
        self.last_nodes = {x.instance_id for x in nodes}
        self.last_nodes_addresses = {x.address for x in nodes}
        # A capped job's nodes are priced before the attempt starts (one it cannot price does
        # not start); any other job's right after, off the path to its start.
        usage = self.budget.start(self.job, n, nodes) if self.budget.cap is not None else ()
        unpriced = (self.budget.stop_reason(dataclasses.replace(self.job, usage=usage))
                    if usage else "")
        if unpriced:  # a cap that cannot be counted: the attempt does not start
            self.budget.stopped = unpriced
            return Failure(FailureKind.BUDGET, unpriced), time.time()
        if managed.cancel_requested(self.paths):  # cancelled while it was priced: final
            return Failure(FailureKind.CANCELLED, "cancelled before the attempt started"), \
                time.time()
        proc = attempts.spawn(argv, run, self.paths.attempt_log(n), uid=self.uid, gid=self.gid)
        started = time.time()
        # The record says RUNNING at once: a controller that dies from here on must find the
        # attempt to re-attach to, never start attempt n a second time.
        self.update(state=JobState.RUNNING.value, attempt=n, world_size=len(nodes),
                    started_at=self.job.started_at or started,
                    usage=(*usage[:-1], dataclasses.replace(usage[-1], started_at=started))
                    if usage else self.job.usage)
        if not usage:  # an uncapped job's nodes are priced now, off the path to its start
            self.update(usage=self.budget.start(self.job, n, nodes, at=started))
        LOG.info("job %s: attempt %d (%s) on %d node(s), runner pid %d", self.job.job_id, n,
                 attempt_id, len(nodes), proc.pid)
        jpaths = ClusterPaths(self.efs).job(attempt_id, self.paths.user)
        # Every elastic attempt: a node lost while it runs is tolerated (torchrun carries on
        # without it), so its replacement must be gated and admitted then too.
        self.rejoin = (rejoin.Rejoin(jpaths, self.uid, self.gid)
                       if self.request.run.elastic else None)
        self.follow(jpaths, lambda: proc.poll() is None)
        detected = time.time()
        if not self.stopping():  # stopping: the next controller takes the attempt over
            attempts.stop_abandoned(jpaths, self.efs, tick=self.tick, root=self.root)
            self.update(usage=JobBudget.end(self.job, n))
        return self.hang_or(attempts.outcome(jpaths, proc.returncode)), detected

    def reattach(self) -> tuple[Failure | None, float]:
        """Follow the current attempt, started by a previous controller, to its end (its
        runner is not our child: its heartbeat on EFS says whether it still runs)."""
        jpaths = ClusterPaths(self.efs).job(self.paths.attempt_key(self.job.attempt))
        m = self.membership()  # the attempt's nodes, and the late nodes it admitted
        self.last_nodes_addresses = {n.address for n in m.nodes} if m else set()
        self.rejoin = (rejoin.Rejoin(jpaths, self.uid, self.gid)
                       if self.request.run.elastic else None)
        self.follow(jpaths, lambda: attempts.runner_alive(jpaths))
        detected = time.time()
        if not self.stopping():
            attempts.stop_abandoned(jpaths, self.efs, tick=self.tick, root=self.root)
            self.update(usage=JobBudget.end(self.job, self.job.attempt))
        return self.hang_or(attempts.outcome(
            jpaths, 0 if userfiles.exists(jpaths.result) else None)), detected

    # -- 4. the loop -------------------------------------------------------------------------
    def run(self, *, reattach: bool = False) -> ManagedJob:
        """Run the job to its end; ``reattach``: its current attempt is already running
        (started by a previous controller): follow it first."""
        if reattach:
            failure, detected = self.reattach()
            if self.stopping():
                return self.job
            self.after_attempt(self.membership(), failure, detected)
        if self.budget.problem and not JobState(self.job.state).terminal:
            return self.finish(JobState.FAILED, self.budget.problem)
        while not JobState(self.job.state).terminal:
            if managed.cancel_requested(self.paths):
                return self.finish(JobState.CANCELLED, "cancelled by the user")
            chosen = self.choose_nodes()
            if self.stopping():
                return self.job
            if chosen is not None and managed.cancel_requested(self.paths):
                chosen = None  # a cancel is final: no later step starts an attempt
            if chosen is None:
                if not JobState(self.job.state).terminal:
                    self.finish(JobState.CANCELLED, "cancelled by the user")
                return self.job
            spent = self.budget.stop_reason(self.job)
            if spent:  # a restart would start past the cap
                return self.finish(JobState.BUDGET, spent)
            failure, detected = self.run_attempt(*chosen)
            if self.stopping():
                return self.job  # the next controller continues (as master-lost)
            self.after_attempt(chosen[0], failure, detected)
        return self.job

    def after_attempt(self, m: Membership | None, failure: Failure | None, detected: float) -> None:
        if self.budget.stopped:
            failure = budget_stop(failure, self.budget.stopped)
        decision = decide(failure, restarts=self.job.restarts,
                          code_restarts=self.job.code_restarts, policy=self.policy,
                          cancel_requested=managed.cancel_requested(self.paths))
        if decision.action is not Action.RESTART or failure is None:
            self.finish(decision.state, decision.reason)
            return
        self.record_restart(m, failure, detected)

    def record_restart(self, m: Membership | None, failure: Failure, detected: float) -> None:
        """A restart record; a node fault's instance marked Unhealthy and excluded, only on
        root's evidence (``node_evidence``), never the master, within the breaker."""
        node = m.node_by_address(failure.address) if m and failure.address else None
        instance = failure.instance_id or (node.instance_id if node else "")
        gone = (node_evidence.executor_gone(self.efs, failure.address, tick=self.tick,
                                            read=self.executors.read)
                if failure.kind.node_fault and failure.address else None)
        mark, err = node_evidence.verdict(failure, instance=instance,
                                          master_instance=m.master.instance_id if m else "",
                                          executor_gone=gone)
        excluded = self.job.excluded
        # an instance excluded already was marked while the (elastic) attempt ran: not twice
        if mark is node_evidence.Mark.MARK and instance not in excluded:
            err = self.health.mark_unhealthy(instance)
            excluded = tuple(sorted({*excluded, instance}))
        rec = RestartRecord(attempt=self.job.attempt, at=detected, kind=failure.kind.value,
                            detail=failure.detail, address=failure.address,
                            instance_id=instance,
                            marked_unhealthy=mark is node_evidence.Mark.MARK and not err,
                            health_error=err)
        LOG.warning("job %s: restart %d after attempt %d: %s: %s%s", self.job.job_id,
                    self.job.restarts + 1, self.job.attempt, failure.kind.value, failure.detail,
                    f" [{err}]" if err else "")
        self.update(state=JobState.RESTARTING.value, restarts=self.job.restarts + 1,
                    code_restarts=self.job.code_restarts + (
                        failure.failure_class in (FailureClass.USER_CODE, FailureClass.INPUT)),
                    excluded=excluded, last_failure=f"{failure.kind.value}: {failure.detail}",
                    restart_log=(*self.job.restart_log, rec))

"""The master agent, as an explicit state machine.

States (:class:`Phase`) and the events (:class:`Event`) that move between them::

    STARTING            --resumed-------------> FORMED    (EFS: this cluster, us as master)
    STARTING            --took-over-----------> FORMED    (EFS: this cluster, its master gone)
    STARTING            --new-cluster---------> PREPARING
    STARTING            --aws-unavailable-----> FAILED
    PREPARING           --prepared------------> WAITING_FOR_GROUPS
    PREPARING           --prep-failed---------> FAILED
    WAITING_FOR_GROUPS  --groups-ready--------> FORMING   (both groups reported success)
    WAITING_FOR_GROUPS  --group-failed--------> FAILED    (an asg-setup failure message)
    WAITING_FOR_GROUPS  --setup-timeout-------> FAILED
    WAITING_FOR_GROUPS  --notification-lost---> FAILED    (on the master queue's DLQ)
    FORMING             --cluster-formed------> FORMED
    FORMING             --discovery-failed----> FAILED
    any but FAILED/STOPPED --stop-------------> STOPPED

- STARTING: AWS clients ready, local state loaded, pending drains resumed, EFS checked for
  a formed cluster (:func:`.policy.start_decision`): one this agent formed (an agent
  restart) is resumed; one whose master instance left the master group (Auto Scaling
  replaced a lost master with this instance) is taken over (:func:`.formation.take_over`:
  the next generation with us as master). Neither signals the wait condition again.
- PREPARING: the data-preparation command, if any (its failure fails the setup).
- WAITING_FOR_GROUPS: long-poll the master queue for the capacity adjuster's ``asg-setup``
  messages until both groups report success; a ``failure`` message, a notification lost
  on the way (:mod:`bootstrap_scripts.agent.lost_notifications`), or no success by the
  setup deadline (``--setup-timeout`` after the first start), fails the setup.
- FORMING: describe both groups, wait (bounded) for their nodes to register (and prepare),
  publish generation 1, protect the base nodes, signal the wait condition SUCCESS
  (:func:`.formation.form`).
- FORMED: every message, registration, guessed GPU count, drain and periodic resync may
  publish a new generation. Failures here are logged, never fatal.
- FAILED: the reason goes to the wait condition (FAILURE); the agent exits with status 2.

:meth:`Master.decide` alone maps (state, event) to the next state; each state's work is one
``_step_*`` method that returns the event it produced (None: stay).
"""

from __future__ import annotations

import threading
import time
from enum import Enum

from bootstrap_scripts.agent import data_prep, formation, policy, setup_report, warm_ready
from bootstrap_scripts.agent import wait_condition as wc
from bootstrap_scripts.agent.aws import MasterAws
from bootstrap_scripts.agent.context import AgentContext
from bootstrap_scripts.agent.drains import Drains
from bootstrap_scripts.agent.lost_notifications import LOOKBACK_SECONDS, LostNotifications
from bootstrap_scripts.agent.lost_notifications import reason as lost_reason
from bootstrap_scripts.agent.master_inbox import Inbox
from bootstrap_scripts.agent.master_state import GroupSetup, MasterState, load_state
from bootstrap_scripts.agent.roster import Roster, SetupFailed
from bootstrap_scripts.agent.settings import EXIT_FAILED
from bootstrap_scripts.protocol import launches, state, store
from bootstrap_scripts.protocol.membership import Membership, MembershipError

__all__ = ["TERMINAL", "TRANSITIONS", "Event", "GroupSetup", "Master", "MasterState", "Phase"]

#: Longest SQS wait of a formed master: it also looks for nodes that registered without any
#: Auto Scaling message (an instance started by hand from the worker launch template).
JOIN_POLL_SECONDS = 5
#: While waiting for setup, the master looks for lost notifications at most this often.
LOST_CHECK_SECONDS = 10.0


class Phase(Enum):
    STARTING = "starting"
    PREPARING = "preparing"
    WAITING_FOR_GROUPS = "waiting-for-groups"
    FORMING = "forming"
    FORMED = "formed"
    FAILED = "failed"
    STOPPED = "stopped"


class Event(Enum):
    RESUMED = "resumed"
    TOOK_OVER = "took-over"
    NEW_CLUSTER = "new-cluster"
    AWS_UNAVAILABLE = "aws-unavailable"
    PREPARED = "prepared"
    PREP_FAILED = "prep-failed"
    GROUPS_READY = "groups-ready"
    GROUP_FAILED = "group-failed"
    SETUP_TIMEOUT = "setup-timeout"
    NOTIFICATION_LOST = "notification-lost"
    DISCOVERY_FAILED = "discovery-failed"
    CLUSTER_FORMED = "cluster-formed"
    STOP = "stop"


TERMINAL = frozenset({Phase.FAILED, Phase.STOPPED})
TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (Phase.STARTING, Event.RESUMED): Phase.FORMED,
    (Phase.STARTING, Event.TOOK_OVER): Phase.FORMED,
    (Phase.STARTING, Event.NEW_CLUSTER): Phase.PREPARING,
    (Phase.STARTING, Event.AWS_UNAVAILABLE): Phase.FAILED,
    (Phase.PREPARING, Event.PREPARED): Phase.WAITING_FOR_GROUPS,
    (Phase.PREPARING, Event.PREP_FAILED): Phase.FAILED,
    (Phase.WAITING_FOR_GROUPS, Event.GROUPS_READY): Phase.FORMING,
    (Phase.WAITING_FOR_GROUPS, Event.GROUP_FAILED): Phase.FAILED,
    (Phase.WAITING_FOR_GROUPS, Event.SETUP_TIMEOUT): Phase.FAILED,
    (Phase.WAITING_FOR_GROUPS, Event.NOTIFICATION_LOST): Phase.FAILED,
    (Phase.FORMING, Event.CLUSTER_FORMED): Phase.FORMED,
    (Phase.FORMING, Event.DISCOVERY_FAILED): Phase.FAILED,
}


class Master(Inbox):
    """The master role of one :class:`NodeAgent` (``run`` blocks until stop or failure);
    what it does with each message of its queue is :class:`~.master_inbox.Inbox`'s."""

    def __init__(self, agent: AgentContext, aws: MasterAws) -> None:
        self.agent = agent
        self.config = agent.config
        self.log = agent.log
        self.aws = aws
        aws.log = agent.log
        self.roster = Roster(agent, aws)
        self.drains = Drains(agent.cluster, aws, drain_timeout=self.config.drain_timeout,
                             log=agent.log, sign=self.roster.sign,
                             verify=self.roster.verify, records=self.roster.records)
        self.phase = Phase.STARTING
        self.failure = ""
        self.state = MasterState(setup_started=time.time())
        self.resync_wanted = False
        self.last_resync = time.monotonic()
        self.lost = LostNotifications(self.config.master_queue_url, agent.log)
        self.last_lost_check = float("-inf")

    # -- the machine -------------------------------------------------------------------------
    @staticmethod
    def decide(phase: Phase, event: Event) -> Phase:
        """The next state after ``event`` in ``phase`` (ValueError: not a valid transition)."""
        if event is Event.STOP and phase not in TERMINAL:
            return Phase.STOPPED
        try:
            return TRANSITIONS[(phase, event)]
        except KeyError:
            raise ValueError(f"master: no transition from {phase.value} on {event.value}") \
                from None

    def run(self) -> int:
        steps = {Phase.STARTING: self._step_starting, Phase.PREPARING: self._step_preparing,
                 Phase.WAITING_FOR_GROUPS: self._step_waiting,
                 Phase.FORMING: self._step_forming, Phase.FORMED: self._step_formed}
        while self.phase not in TERMINAL:
            event = Event.STOP if self.agent.stop.is_set() else steps[self.phase]()
            if event is not None:
                new = self.decide(self.phase, event)
                self.log.info("event=master-state from=%s to=%s on=%s", self.phase.value,
                              new.value, event.value)
                self.phase = new
        if self.phase is Phase.FAILED:
            self.log.error("event=setup-failed reason=%r", self.failure)
            self.agent.signal(wc.FAILURE, self.failure)
            return EXIT_FAILED
        return 0

    def _serve_warm_ready(self) -> None:
        """With a warm pool: complete the launch action of each worker that says it is
        ready, in a thread of its own (``bootstrap_scripts.agent.warm_ready``)."""
        c = self.config
        if not c.launch_hook:
            return
        server = warm_ready.ReadyServer(
            queue_url=c.warm_ready_queue_url, worker_role_id=c.worker_role_id,
            sqs=self.aws.sqs, log=self.log, stop=self.agent.stop,
            complete=warm_ready.completer(self.aws.autoscaling, cluster_id=c.cluster_id,
                                          hook_name=c.launch_hook))
        threading.Thread(target=server.serve, daemon=True, name="warm-ready").start()
        self.log.info("event=warm-ready-serving queue=%s", c.warm_ready_queue_url)

    def _fail(self, event: Event, reason: str) -> Event:
        self.failure = reason
        return event

    # -- the states' work ------------------------------------------------------------------
    def _step_starting(self) -> Event:
        if not self.aws.ready():
            return self._fail(Event.AWS_UNAVAILABLE, f"could not create AWS clients for region "
                              f"{self.config.region!r} (see the traceback above)")
        self._serve_warm_ready()
        self.roster.prepare_key()
        path = self.agent.paths.agent_state
        self.state = load_state(path) or MasterState(setup_started=time.time())
        self._save_state()
        self.drains.resume()
        decision, published = self._formed_on_efs()
        if decision == policy.TAKE_OVER:
            self.resync_wanted = not formation.take_over(self.agent, self.roster, self.drains,
                                                         published)
            self.last_resync = time.monotonic()
            return Event.TOOK_OVER
        if decision != policy.RESUME:
            return Event.NEW_CLUSTER
        self.agent.apply(published)
        self.agent.formed.set()
        self.log.info("event=resume generation=%d (cluster already formed)",
                      published.generation)
        self.roster.protect(published)
        self.resync_wanted = True
        self.last_resync = time.monotonic()
        return Event.RESUMED

    def _step_preparing(self) -> Event:
        if not self.config.data_prep or data_prep.prepare(
                self.config, self.agent.identity, stop=self.agent.stop, log=self.log):
            return Event.PREPARED
        if self.agent.stop.is_set():
            return Event.STOP
        failed = self.agent.cluster.prepared(self.agent.identity.instance_id, "failed")
        return self._fail(Event.PREP_FAILED, f"data preparation failed on the master "
                          f"{self.agent.identity.instance_id}: see {failed}")

    def _step_waiting(self) -> Event | None:
        deadline = self.state.setup_started + self.config.setup_timeout
        wait = policy.receive_wait(poll_wait=self.config.poll_wait, formed=False,
                                   seconds_left=deadline - time.time(),
                                   join_poll=JOIN_POLL_SECONDS, look_often=False,
                                   drains=bool(self.drains))
        try:
            self._receive_and_handle(wait)
        except SetupFailed as exc:
            return self._fail(Event.GROUP_FAILED, str(exc))
        self.drains.check()
        if policy.setup_complete(self._setup_statuses()):
            return Event.GROUPS_READY
        if time.monotonic() - self.last_lost_check >= LOST_CHECK_SECONDS:
            self.last_lost_check = time.monotonic()
            lost = self.lost.since(self.aws.sqs, self.state.setup_started - LOOKBACK_SECONDS)
            if lost:
                return self._fail(Event.NOTIFICATION_LOST,
                                  lost_reason(self.config.cluster_id, lost))
        if time.time() >= deadline:
            return self._fail(Event.SETUP_TIMEOUT, self._timeout_reason())
        return None

    def _step_forming(self) -> Event:
        try:
            formation.form(self.agent, self.roster, self.drains, self.state)
        except SetupFailed as exc:
            return self._fail(Event.DISCOVERY_FAILED, str(exc))
        self.resync_wanted = False
        self.last_resync = time.monotonic()
        return Event.CLUSTER_FORMED

    def _step_formed(self) -> None:
        roster = self.roster
        wait = policy.receive_wait(poll_wait=self.config.poll_wait, formed=True,
                                   seconds_left=0.0, join_poll=JOIN_POLL_SECONDS,
                                   look_often=roster.look_often(), drains=bool(self.drains))
        self._receive_and_handle(wait)
        self.drains.check()
        if roster.fallback_gpus and roster.gpu_counts_changed():
            self.resync_wanted = True
        if roster.joiners_ready() or roster.new_registrations():
            self.resync_wanted = True
        if self.resync_wanted or \
                time.monotonic() - self.last_resync >= self.config.resync_interval:
            roster.resync("membership-change" if self.resync_wanted else "periodic-resync",
                          self.drains.active)
            self.resync_wanted = False
            self.last_resync = time.monotonic()

    # -- helpers -----------------------------------------------------------------------------
    def _timeout_reason(self) -> str:
        """The SETUP_TIMEOUT reason: which groups, instances and registrations were missing,
        with the newest launch failure of each group (:mod:`.setup_report`)."""
        missing = policy.missing_groups(self._setup_statuses())
        groups: dict[str, setup_report.GroupSeen] = {}
        for role in missing:
            try:
                g = self.aws.group_state(role)
            except Exception as exc:  # a diagnostic: the failure is signalled regardless
                groups[role] = setup_report.GroupSeen(role, False, error=repr(exc)[:200])
                continue
            groups[role] = setup_report.GroupSeen(role, False) if g is None else \
                setup_report.GroupSeen(role, True, g.name, g.desired, tuple(
                    (i.instance_id, i.instance_type) for i in g.instances) + tuple(
                    (iid, "") for iid in g.missing_address))
        ids = [iid for g in groups.values() for iid, _ in g.instances]
        registered = set(self.roster.read_registrations(ids))
        return setup_report.timeout_reason(
            cluster_id=self.config.cluster_id, timeout=self.config.setup_timeout,
            missing=missing, groups=groups, registered=registered,
            failures=launches.launch_failures(self.agent.cluster),
            no_key=self.roster.unkeyed(set(ids) - registered))

    def _save_state(self) -> None:
        store.write_record(self.agent.paths.agent_state, self.state, mode=0o600)

    def _setup_statuses(self) -> dict[str, str]:
        return {role: seen.status for role, seen in self.state.setup.items()}

    def _formed_on_efs(self) -> tuple[str, Membership | None]:
        """What the membership on EFS means for us (:func:`.policy.start_decision`)."""
        try:
            m = state.read_current(self.agent.cluster.efs)
        except (OSError, MembershipError) as exc:
            self.log.warning("event=bad-membership path=%s error=%s",
                             self.agent.cluster.membership, exc)
            m = None
        if m is None:  # unreadable or gone: put the last generation back if there was one
            m = formation.repair(self.agent, self.roster)
            if m is None:
                return policy.NEW_CLUSTER, None
        me = self.agent.identity.instance_id
        master_group: set[str] = set()
        if m is not None and m.cluster_id == self.config.cluster_id and \
                m.master.instance_id != me:
            try:
                master_group = self.roster.live_masters()
            except SetupFailed as exc:
                self.log.error("event=takeover-check-failed error=%s (waiting for the setup "
                               "messages instead)", exc)
                return policy.NEW_CLUSTER, m
        decision = policy.start_decision(
            cluster_id=self.config.cluster_id, me=me,
            recorded_cluster=m.cluster_id if m else None,
            recorded_master=m.master.instance_id if m else "", master_group=master_group)
        if decision == policy.NOT_OURS_TO_TAKE:
            self.log.error("event=master-still-live instance_id=%s (this cluster's master "
                           "still runs in the master group: not taking it over)",
                           m.master.instance_id)
        return decision, m

"""The master's decisions about membership, as pure functions (no AWS, no files, no clock).

Who may join, who is a protected base worker, which workers form the cluster, what a
drain request means and how long to wait on the queue: each is a function of facts the
master gathered (group instances, registrations, data-preparation outcomes, drain records),
so tests/agent/test_policy.py checks them without moto or EFS.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from bootstrap_scripts.agent.discovery import Instance
from bootstrap_scripts.protocol.membership import Membership, Node, address_key
from bootstrap_scripts.protocol.records import Registration

ROLES = ("master", "worker")

# -- joining ---------------------------------------------------------------------------------
#: Why a live worker that is not a member cannot join (yet).
DRAINED = "drained"  # drained once: it is on its way out, for good
UNREGISTERED = "unregistered"  # its agent has not registered yet
PREPARING = "preparing"  # registered, data preparation still running
PREP_FAILED = "data-prep-failed"  # its data preparation failed: never joins
#: Blockers that will not go away: the master stops looking at such a node.
PERMANENT = frozenset({DRAINED, PREP_FAILED})


def join_blocker(*, drained: bool, registered: bool, data_prep: bool,
                 prep: str | None) -> str | None:
    """Why a worker cannot join now, or None when it may. ``prep`` is its data-preparation
    outcome ("ok", "failed" or None), only looked at when ``data_prep`` is set."""
    if drained:
        return DRAINED
    if not registered:
        return UNREGISTERED
    if data_prep:
        if prep is None:
            return PREPARING
        if prep == "failed":
            return PREP_FAILED
    return None


def split_workers(workers: Iterable[Instance], *, members: Collection[str],
                  draining: Collection[str], blockers: Mapping[str, str | None],
                  ) -> tuple[list[Instance], set[str]]:
    """After formation: (the workers of the next membership, the ones still joining).

    Members stay while their instance is live and not draining; a newcomer is in once
    nothing blocks it (``blockers``, by instance id, for the non-members); a newcomer with a
    permanent blocker is neither in nor pending."""
    eligible: list[Instance] = []
    pending: set[str] = set()
    for w in workers:
        if w.instance_id in draining:
            continue
        if w.instance_id in members:
            eligible.append(w)
            continue
        blocker = blockers.get(w.instance_id, UNREGISTERED)
        if blocker is None:
            eligible.append(w)
        elif blocker not in PERMANENT:
            pending.add(w.instance_id)
    return eligible, pending


def forming_workers(workers: Iterable[Instance], *, draining: Collection[str],
                    prepared: Collection[str] | None) -> tuple[list[Instance], list[str]]:
    """At formation: (the workers of generation 1, the ones left to join later).

    Draining workers are out. With a data-preparation hook (``prepared`` = the registered
    workers whose preparation succeeded) only prepared ones are in; without one
    (``prepared`` None) every live worker is, registered or not (an unregistered one gets a
    guessed GPU count, corrected once it registers)."""
    live = [w for w in workers if w.instance_id not in draining]
    if prepared is None:
        return live, []
    ready = [w for w in live if w.instance_id in prepared]
    left_out = sorted({w.instance_id for w in live} - {w.instance_id for w in ready})
    return ready, left_out


# -- base (protected) workers ----------------------------------------------------------------
def base_target(base_workers: int, worker_count: int) -> int:
    """How many base workers the cluster keeps: ``--base-workers``, or every worker (-1)."""
    return worker_count if base_workers < 0 else base_workers


def choose_base(workers: Sequence[Instance], target: int) -> set[str]:
    """The protected workers at formation: the first ``target`` in membership order,
    on-demand before Spot (a Spot instance can be reclaimed whatever we set)."""
    ordered = sorted(workers, key=lambda w: (w.spot, address_key(w.address), w.instance_id))
    return {w.instance_id for w in ordered[:target]}


def restored_target(base_workers: int, members: Mapping[str, Node]) -> int:
    """The base count of a cluster formed by an earlier agent: ``--base-workers``, or (-1)
    as many as the membership marks base."""
    if base_workers >= 0:
        return base_workers
    return sum(1 for n in members.values() if n.role == "worker" and n.base)


def base_after(eligible: Sequence[Instance], members: Mapping[str, Node], *, target: int,
               group_members: Collection[str]) -> set[str]:
    """The base workers of the next generation. Members keep their flag; while fewer base
    workers remain than ``target`` (a base worker was replaced), on-demand group members
    joining now are promoted, in address order. Hand-started nodes (in no group) cannot be
    protected, so they are never promoted."""
    base = {w.instance_id for w in eligible
            if w.instance_id in members and members[w.instance_id].base}
    candidates = sorted((w for w in eligible if w.instance_id not in members
                         and not w.spot and w.instance_id in group_members),
                        key=lambda w: (address_key(w.address), w.instance_id))
    for w in candidates:
        if len(base) >= target:
            break
        base.add(w.instance_id)
    return base


def newly_base(new: Membership, members: Mapping[str, Node]) -> set[str]:
    """Workers that are base in ``new`` but were not (promoted: protect them now)."""
    was = {i for i, n in members.items() if n.base}
    return {n.instance_id for n in new.nodes[1:] if n.base} - was


def protection_targets(m: Membership) -> dict[str, list[str]]:
    """Instances to protect from scale-in, by group role: the master and the base workers."""
    return {"master": [m.master.instance_id],
            "worker": [n.instance_id for n in m.nodes[1:] if n.base]}


# -- membership entries ------------------------------------------------------------------------
def worker_entries(workers: Iterable[Instance], registrations: Mapping[str, Registration], *,
                   base: Collection[str] | None, fallback_gpus: int,
                   ) -> tuple[list[dict], set[str]]:
    """Worker entries for :func:`~bootstrap_scripts.protocol.membership.build_membership`,
    with GPU counts from the registrations, and the ids whose count was guessed
    (``fallback_gpus``: the master's own). ``base`` None: every worker is base."""
    entries, guessed = [], set()
    for inst in workers:
        reg = registrations.get(inst.instance_id)
        if reg is not None:
            gpus = reg.gpus
        else:
            gpus = fallback_gpus
            guessed.add(inst.instance_id)
        entries.append({"instance_id": inst.instance_id, "address": inst.address,
                        "gpus": gpus, "instance_type": inst.instance_type,
                        "base": base is None or inst.instance_id in base})
    return entries, guessed


def gpu_corrections(current: Membership, registrations: Mapping[str, Registration],
                    ) -> tuple[bool, set[str]]:
    """For nodes whose GPU count was guessed: (a registration reports a different count,
    the ids that registered and so need no more watching)."""
    changed = False
    for iid, reg in registrations.items():
        node = current.node_by_instance(iid)
        if node is not None and reg.gpus != node.gpus:
            changed = True
    return changed, set(registrations)


# -- drains ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DrainPlan:
    """What a new drain request means: complete its lifecycle action at once (with this
    reason) or wait for the node, and whether the groups must be re-read now."""

    complete_now: str | None
    resync: bool


def plan_drain(*, is_master: bool, is_member: bool, formed: bool) -> DrainPlan:
    """- the master itself: nothing to drain it from, complete ("master");
    - not a member, or before formation: nothing runs there, complete ("not-a-member");
      after formation re-read the groups anyway (it may have been about to join);
    - a member: publish a generation without it and wait for its executor."""
    if is_master:
        return DrainPlan("master", resync=False)
    if not is_member or not formed:
        return DrainPlan("not-a-member", resync=formed)
    return DrainPlan(None, resync=True)


def drain_due(*, now: float, deadline: float, retry_at: float, done: bool) -> str | None:
    """Why a pending drain can be completed now ("done": the executor wrote ``.done``;
    "deadline": ``--drain-timeout`` passed), or None. Nothing while a retry is pending."""
    if retry_at > now:
        return None
    if done:
        return "done"
    if now >= deadline:
        return "deadline"
    return None


def retry_delay(attempts: int) -> float:
    """Seconds before the next CompleteLifecycleAction after ``attempts`` failures."""
    return 2.0 * attempts


# -- starting ----------------------------------------------------------------------------------
#: What a starting master does with the membership it finds on EFS.
NEW_CLUSTER = "new-cluster"  # none (or another cluster's): form it from the setup messages
RESUME = "resume"  # ours, with this instance as master: the agent restarted
TAKE_OVER = "take-over"  # ours, its master instance replaced by this one: lead it on
NOT_OURS_TO_TAKE = "master-still-live"  # ours, but its master still runs: do not compete


def start_decision(*, cluster_id: str, me: str, recorded_cluster: str | None,
                   recorded_master: str, master_group: Collection[str]) -> str:
    """How a starting master comes to lead: ``recorded_cluster`` / ``recorded_master`` are
    the cluster id and master instance of the membership on EFS (None: there is none),
    ``master_group`` the live, healthy instances of the master group.

    A replacement master (Auto Scaling replaced the lost one) finds a formed cluster whose
    master instance left the master group: it takes over. While the recorded master still
    runs in the group, a second master instance must not publish over it; it behaves as
    before a formation (it waits for the setup messages, which never come for a formed
    cluster, and fails at the setup deadline with that reason)."""
    if recorded_cluster is None or recorded_cluster != cluster_id:
        return NEW_CLUSTER
    if recorded_master == me:
        return RESUME
    if recorded_master in master_group:
        return NOT_OURS_TO_TAKE
    return TAKE_OVER


# -- setup and polling -----------------------------------------------------------------------
def setup_complete(statuses: Mapping[str, str]) -> bool:
    """Both groups reported ``asg-setup`` success (``statuses``: role -> status)."""
    return all(statuses.get(r) == "success" for r in ROLES)


def setup_failure_holds(*, failed_min: int, live_now: int | None) -> bool:
    """An ``asg-setup`` failure fails the setup only if its group is still below the minimum
    the message names when the master reads it (``live_now``: the group's live instances
    now; None when they cannot be read, which trusts the message).

    The capacity adjuster reports a failure once a launch error is final (a configuration or
    quota error) or transient ones outlasted its retry window; Auto Scaling goes on retrying
    after that, and SQS does not keep messages in order, so a group may have reached its
    minimum since, with its success message behind the failure. Failing the stack then would
    roll back a cluster that can form."""
    return live_now is None or live_now < failed_min


def missing_groups(statuses: Mapping[str, str]) -> list[str]:
    return [r for r in ROLES if r not in statuses]


def receive_wait(*, poll_wait: int, formed: bool, seconds_left: float, join_poll: int,
                 look_often: bool, drains: bool) -> int:
    """Seconds to long-poll the master queue this round.

    Before formation: ``poll_wait``, but never past the setup deadline. After: at most
    ``join_poll`` (nodes can register without any message), and 1 s while something on EFS
    is awaited (``look_often``: a guessed GPU count, pending joiners) or a drain is pending."""
    wait = poll_wait
    if not formed:
        wait = max(0, min(wait, int(seconds_left) + 1))
    else:
        wait = min(wait, join_poll)
        if look_often:
            wait = min(wait, 1)
    if drains:
        wait = min(wait, 1)
    return wait

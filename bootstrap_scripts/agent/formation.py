"""How a master comes to lead its cluster: forming it, or taking it over from EFS.

- :func:`form`: generation 1 of a new cluster (FORMING in :mod:`.master`), from the groups
  the ``asg-setup`` messages announced, once their nodes registered (and prepared); then
  scale-in protection and the wait condition's SUCCESS.
- :func:`take_over`: a replacement master (Auto Scaling replaced a lost master instance)
  finds on EFS a formed cluster of its cluster id whose master instance is gone
  (:func:`~bootstrap_scripts.agent.policy.start_decision`). No ``asg-setup`` message will
  come (the groups were set up long ago) and the stack is complete, so it neither waits for
  them nor signals the wait condition: it rebuilds the roster from the groups and the
  registrations, publishes the next generation (the numbers continue) with itself as
  master, and protects the master and the base workers. Until that generation arrives the
  workers keep the files of the last one (they only ever apply a newer generation).
"""

from __future__ import annotations

import json
import time

from bootstrap_scripts.agent import policy
from bootstrap_scripts.agent import wait_condition as wc
from bootstrap_scripts.agent.context import AgentContext
from bootstrap_scripts.agent.drains import Drains
from bootstrap_scripts.agent.master_state import MasterState
from bootstrap_scripts.agent.roster import Roster
from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.records import Registration

#: How long formation waits for instances the Lambda listed that the group's description does
#: not show (yet): Auto Scaling's description can lag its notifications by seconds.
ABSENT_WAIT_SECONDS = 60.0


def take_over(agent: AgentContext, roster: Roster, drains: Drains,
              previous: Membership) -> bool:
    """Lead the formed cluster ``previous`` (its master instance was replaced by this one);
    True once the next generation is published (False: the groups could not be read now,
    the caller retries at its next resync)."""
    log = agent.log
    log.warning("event=take-over cluster_id=%s previous_master=%s (%s) generation=%d (the "
                "master instance was replaced; the stack is already complete: no "
                "wait-condition signal)", previous.cluster_id, previous.master.instance_id,
                previous.master_addr, previous.generation)
    agent.current = previous  # the roster compares with the last published generation
    agent.formed.set()
    roster.resync("took-over", drains.active)
    current = agent.current
    if current is None or current.generation <= previous.generation:
        return False
    roster.protect(current)
    log.info("event=took-over generation=%d master=%s nodes=%d", current.generation,
             current.master_addr, len(current.nodes))
    return True


def form(agent: AgentContext, roster: Roster, drains: Drains, kept: MasterState) -> None:
    """Generation 1: the groups' nodes, once registered (and prepared), or the wait is
    over; then protection and the SUCCESS signal. ``kept``: the setup messages."""
    config, cluster, log = agent.config, agent.cluster, agent.log
    expected = kept.setup["worker"].instances
    for role, seen in kept.setup.items():
        if seen.asg:
            roster.group_names.setdefault(role, seen.asg)
    # A launched node has the boot budget (--registration-wait) to boot and register; an
    # instance the Lambda listed but the group no longer has is not booting (terminated, or
    # the group's description lags): it gets the describe-consistency window only.
    give_up = time.monotonic() + config.registration_wait
    absent_give_up = time.monotonic() + min(ABSENT_WAIT_SECONDS, config.registration_wait)
    # With a data-preparation hook, registered nodes may take long to be prepared: wait
    # for their markers up to the setup deadline (not the registration wait).
    prep_give_up = time.monotonic() + max(
        0.0, kept.setup_started + config.setup_timeout - time.time() - 5.0)
    workers = roster.discover_with_retry(expected)
    described = time.monotonic()
    seen: dict[str, Registration] = {}
    while True:
        ids = [w.instance_id for w in workers]
        # Only the registrations still missing are opened again at each 0.1 s tick:
        # re-reading every node's took 0.1 CPU at 64 nodes (~0.15 ms each), so about
        # 1.5 CPU at 1,024, all the while the master waits for the last few.
        seen.update(roster.read_registrations(i for i in ids if i not in seen))
        registrations = {i: seen[i] for i in ids if i in seen}
        unregistered = [i for i in ids if i not in registrations]
        absent = [i for i in expected if i not in ids]
        unprepared = [i for i in ids if i in registrations and config.data_prep
                      and state.prep_status(cluster.efs, i) is None]
        waiting_registration = (unregistered and time.monotonic() < give_up) or (
            absent and time.monotonic() < absent_give_up)
        waiting_prep = unprepared and time.monotonic() < prep_give_up
        if not (waiting_registration or waiting_prep) or agent.stop.is_set():
            break
        agent.stop.wait(0.1)
        if absent and time.monotonic() - described >= 2.0:  # AWS APIs: every 2 s at most
            workers = roster.discover_with_retry(expected)
            described = time.monotonic()
    registrations = roster.read_registrations(ids)  # once more, fresh, for the entries
    unregistered = [i for i in ids if i not in registrations]
    if absent:
        log.warning("event=workers-absent instances=%s (the Lambda listed them; "
                "proceeding with the nodes present)", ",".join(absent))
    if unregistered:
        types = {w.instance_id: w.instance_type for w in workers}
        log.warning("event=workers-unregistered instances=%s waited=%.0fs (the boot budget: "
                "still booting, or their boot failed, see their /var/log/dl-bootstrap.log; "
                "using the master's GPU count %d for them until they register)",
                ",".join(f"{i}:{types.get(i) or '?'}" for i in unregistered),
                config.registration_wait, agent.gpus)
    prepared = None
    if config.data_prep:
        prepared = {w.instance_id for w in workers if w.instance_id in registrations
                    and state.prep_status(cluster.efs, w.instance_id) == "ok"}
    workers, left_out = policy.forming_workers(workers, draining=drains.active,
                                               prepared=prepared)
    if left_out:
        # They join when prepared (and are promoted to base while the base count is short).
        log.warning("event=workers-not-prepared instances=%s (they join when "
                "prepared)", ",".join(left_out))
        roster.pending_join = set(left_out)
    roster.base_target = policy.base_target(config.base_workers, len(workers))
    base = policy.choose_base(workers, roster.base_target)
    entries, fallback = policy.worker_entries(workers, registrations, base=base,
                                              fallback_gpus=agent.gpus)
    m = roster.publish(entries, reason="initial")
    roster.set_fallback(fallback)
    roster.protect(m)
    agent.formed.set()
    signal_once(agent, m)


def signal_once(agent: AgentContext, m: Membership) -> None:
    """Signal SUCCESS for ``m``, unless ``cluster/wait-condition.json`` says this cluster's
    wait condition was signalled already. The record is written right after the signal
    (written first, a crash before the signal would leave the stack waiting for it); a
    crash in between can only repeat the signal with the same UniqueId (this instance
    id), and AWS tells a resource's signals apart by their unique ids."""
    config, log = agent.config, agent.log
    done = state.read_wait_signal(agent.cluster.efs)
    if done is not None and done.cluster_id == config.cluster_id:
        log.warning("event=already-signalled status=%s instance_id=%s generation=%d (no "
                    "second wait-condition signal)", done.status, done.instance_id,
                    done.generation)
        return
    data = json.dumps({"nodes": len(m.nodes), "generation": m.generation,
                       "master": m.master_addr})
    reason = f"cluster {config.cluster_id} formed: {len(m.nodes)} nodes, generation " \
             f"{m.generation}"
    agent.signal(wc.SUCCESS, reason, data)
    try:
        state.write_wait_signal(agent.cluster.efs, state.WaitSignal(
            cluster_id=config.cluster_id, status=wc.SUCCESS,
            instance_id=agent.identity.instance_id, generation=m.generation,
            signalled_at=time.time(), reason=reason))
    except OSError as exc:
        log.warning("event=wait-signal-record-failed error=%r", exc)


def repair(agent: AgentContext, roster: Roster) -> Membership | None:
    """A ``membership.json`` that cannot be read (truncated, garbage) or is gone, in a
    cluster that published before:
    put the last generation back WITHOUT publishing a new one (no new generation, no
    ``membership.log`` lines, no signal). From ``generations/<N>.json`` when it reads (the
    same document); else rebuilt as generation N from the groups (Auto Scaling's live
    instances) and the registrations on EFS. None: nothing was ever published here (a new
    cluster), or the groups cannot be read now."""
    efs, log = agent.cluster.efs, agent.log
    number = state.latest_generation(efs)
    done = state.read_wait_signal(efs)
    if done is not None and done.cluster_id == agent.config.cluster_id:
        number = max(number, done.generation)
    if number < 1:
        return None
    m = state.read_generation(efs, number)
    source = "generation-file"
    if m is None or m.cluster_id != agent.config.cluster_id:
        try:
            m = roster.rebuild(number)
        except Exception as exc:  # the groups cannot be read now: wait for setup instead
            log.error("event=membership-repair-failed generation=%d error=%s", number, exc)
            return None
        source = "groups-and-registrations"
    state.restore_current(efs, m, roster.sign)
    log.warning("event=membership-repaired generation=%d source=%s nodes=%d (no new "
                "generation, no signal)", m.generation, source, len(m.nodes))
    return m

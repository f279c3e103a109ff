"""The master's view of who is in the cluster, and the publishing of new generations.

Facts come from the groups (Auto Scaling and EC2, through :mod:`.aws`), the registrations
on EFS and the data-preparation markers; :mod:`.policy` decides; this module gathers the
facts, remembers what must be looked at again (joiners, guessed GPU counts, registrations
no message announced) and publishes a generation when the node list changed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from bootstrap_scripts.agent import discovery as disco
from bootstrap_scripts.agent import policy
from bootstrap_scripts.agent.aws import MasterAws
from bootstrap_scripts.agent.membership_key import MembershipKey, membership_key
from bootstrap_scripts.node.node_keys import RecordCheck
from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.membership_signature import Signer, Verifier
from bootstrap_scripts.protocol.records import Registration

if TYPE_CHECKING:
    from bootstrap_scripts.agent.context import AgentContext

#: Seconds the master polls every second while a node's GPU count is still a guess.
FAST_POLL_WINDOW = 600.0
#: Seconds formation keeps retrying to describe the groups through throttling and blips.
DESCRIBE_RETRY_SECONDS = 60.0


class SetupFailed(RuntimeError):
    """The cluster cannot form; the message is the wait-condition reason."""


class Roster:
    def __init__(self, agent: AgentContext, aws: MasterAws) -> None:
        self.agent = agent
        self.aws = aws
        self.cluster = agent.cluster
        #: role -> Auto Scaling group name (for protection).
        self.group_names: dict[str, str] = {}
        #: live instances of the worker group (hand-started nodes are not in it).
        self.group_members: set[str] = set()
        #: live workers waiting to join (not registered / not prepared yet).
        self.pending_join: set[str] = set()
        self.seen_registrations: set[str] = set()
        self.prep_failed_logged: set[str] = set()
        self.base_target: int | None = None
        #: nodes whose GPU count was guessed (not registered yet): re-checked until they are.
        self.fallback_gpus: set[str] = set()
        self.fast_poll_until = 0.0
        #: the membership key, one KMS client for the master's whole run (None: unsigned).
        self.key: MembershipKey | None = membership_key(agent.config)
        #: node records are believed only from their node, once this master learns keys
        self.records = RecordCheck.for_node(agent.paths, agent.log)

    @property
    def log(self):
        return self.agent.log

    @property
    def sign(self) -> Signer | None:
        """The master's signer (None: no membership key, documents go out unsigned)."""
        return self.key.sign if self.key else None

    @property
    def verify(self) -> Verifier | None:
        """The master's own check of what the master signed (a drain record it resumes),
        with the key :meth:`prepare_key` fetched the public half of (None: unsigned)."""
        return self.key.verify if self.key else None

    def prepare_key(self) -> None:
        """Build the KMS client and fetch the public key now (master STARTING), not on the
        first publish's path."""
        if self.key is not None:
            self.key.prepare(self.log)

    @property
    def current(self) -> Membership | None:
        return self.agent.current

    def self_entry(self) -> dict:
        ident = self.agent.identity
        return {"instance_id": ident.instance_id, "address": ident.address,
                "gpus": self.agent.gpus, "instance_type": ident.instance_type}

    # -- the groups -------------------------------------------------------------------------
    def discover_workers(self, extra_ids: Iterable[str] = ()) -> list[disco.Instance]:
        """Live worker instances (plus ``extra_ids`` found by EC2 alone), by instance id.
        Raises SetupFailed when the groups are ambiguous."""
        me = self.agent.identity.instance_id
        found: dict[str, disco.Instance] = {}
        for role in policy.ROLES:
            try:
                group = self.aws.group_state(role)
            except disco.DiscoveryError as exc:
                raise SetupFailed(str(exc)) from exc
            if group is None:
                self.log.error("event=group-missing role=%s cluster_id=%s tags=%s,%s", role,
                               self.agent.config.cluster_id, disco.CLUSTER_TAG_KEY,
                               disco.ROLE_TAG_KEY)
                continue
            self.group_names[role] = group.name
            if role == "worker":
                self.group_members = {i.instance_id for i in group.instances}
            if group.missing_address:
                self.log.info("event=no-address-yet role=%s instances=%s", role,
                              ",".join(group.missing_address))
            for inst in group.instances:
                if role == "master" and inst.instance_id != me:
                    self.log.warning("event=extra-master instance_id=%s (ignored)",
                                     inst.instance_id)
                elif role == "worker":
                    found[inst.instance_id] = inst
        missing = [i for i in extra_ids if i not in found and i != me]
        if missing:
            found.update(self.aws.describe_addresses(missing))
        return sorted(found.values(), key=lambda i: i.instance_id)

    def discover_with_retry(self, expected: Iterable[str]) -> list[disco.Instance]:
        """:meth:`discover_workers`, riding out API throttling and blips for a minute."""
        expected = tuple(expected)
        give_up = time.monotonic() + DESCRIBE_RETRY_SECONDS
        while True:
            try:
                return self.discover_workers(expected)
            except SetupFailed:
                raise
            except Exception as exc:
                if time.monotonic() >= give_up:
                    raise SetupFailed(f"cannot describe the groups of cluster "
                                      f"{self.agent.config.cluster_id}: {exc}") from exc
                self.log.warning("event=describe-retry error=%r", exc)
                self.agent.stop.wait(2.0)

    def live_masters(self) -> set[str]:
        """The live, healthy instances of the master group (retried like formation's
        describe; SetupFailed when the group cannot be read)."""
        give_up = time.monotonic() + DESCRIBE_RETRY_SECONDS
        while True:
            try:
                group = self.aws.group_state("master")
            except disco.DiscoveryError as exc:
                raise SetupFailed(str(exc)) from exc
            except Exception as exc:
                if time.monotonic() >= give_up or self.agent.stop.is_set():
                    raise SetupFailed(f"cannot describe the master group of cluster "
                                      f"{self.agent.config.cluster_id}: {exc}") from exc
                self.log.warning("event=describe-retry error=%r", exc)
                self.agent.stop.wait(2.0)
                continue
            if group is None:
                return set()
            self.group_names["master"] = group.name
            return {i.instance_id for i in group.instances} | set(group.missing_address)

    # -- registrations ------------------------------------------------------------------------
    def read_registrations(self, ids: Iterable[str]) -> dict[str, Registration]:
        """Open each expected registration by path: on NFS, open() revalidates, listings lag.
        With node keys, only a registration its node signed counts (``node_keys``)."""
        out = {}
        for iid in ids:
            if self.records.active:
                reg = self.records.record(self.cluster.registration(iid), Registration,
                                          instance_id=iid, what="node registration",
                                          fields={"instance_id": iid})
            else:
                reg = state.read_registration(self.cluster.efs, iid)
            if reg is not None:
                out[iid] = reg
        return out

    def unkeyed(self, ids: Iterable[str]) -> set[str]:
        """Of ``ids``, those whose registration is on EFS but whose node key this master
        has not learnt (a node on user data older than node keys: it booted, yet never
        counts as registered). Empty on a master that checks no records."""
        if not self.records.active:
            return set()
        return {iid for iid in ids if self.records.book.key_of(iid) is None
                and os.path.lexists(self.cluster.registration(iid))}

    def registered_outsiders(self) -> tuple[str, ...]:
        """Registered workers of this cluster that are in no group (started by hand)."""
        cluster_id = self.agent.config.cluster_id
        return tuple(sorted(
            iid for iid, reg in self.read_registrations(
                state.registered_ids(self.cluster.efs)).items()
            if reg.role == "worker" and reg.cluster_id in ("", cluster_id)
            and iid not in self.group_members))

    def new_registrations(self) -> bool:
        """True when a node registered that we have not considered yet (e.g. started by
        hand from the worker launch template: no Auto Scaling message announces it)."""
        known = {n.instance_id for n in self.current.nodes} if self.current else set()
        unknown = (state.registered_ids(self.cluster.efs) - known - self.seen_registrations
                   - self.pending_join)
        self.seen_registrations |= unknown
        return bool(unknown)

    def join_blocker(self, iid: str, registrations: Collection[str]) -> str | None:
        """Why a live worker that is not a member cannot join yet (None: it can)."""
        config = self.agent.config
        drained = state.read_drain(self.cluster.efs, iid) is not None
        registered = iid in registrations
        prep = (state.prep_status(self.cluster.efs, iid)
                if config.data_prep and registered and not drained else None)
        blocker = policy.join_blocker(drained=drained, registered=registered,
                                      data_prep=bool(config.data_prep), prep=prep)
        if blocker == policy.PREP_FAILED and iid not in self.prep_failed_logged:
            self.prep_failed_logged.add(iid)
            self.log.warning("event=join-refused instance_id=%s reason=data-prep-failed", iid)
        return blocker

    def joiners_ready(self) -> bool:
        """True when a pending joiner has registered and prepared (or failed: drop it)."""
        if not self.pending_join:
            return False
        ids = sorted(self.pending_join)
        registrations = self.read_registrations(ids)
        ready = False
        for iid in ids:
            blocker = self.join_blocker(iid, registrations)
            if blocker in policy.PERMANENT:
                self.pending_join.discard(iid)
            elif blocker is None:
                ready = True
        return ready

    def gpu_counts_changed(self) -> bool:
        """True when a node we guessed the GPU count for has registered a different one."""
        if self.current is None:
            return False
        changed, resolved = policy.gpu_corrections(
            self.current, self.read_registrations(sorted(self.fallback_gpus)))
        self.fallback_gpus -= resolved
        return changed

    def set_fallback(self, fallback: set[str]) -> None:
        """Remember guessed GPU counts; poll fast for their registrations for 10 minutes
        (after that a node that never registered is not worth a receive per second)."""
        self.fallback_gpus = set(fallback)
        if fallback:
            self.fast_poll_until = time.monotonic() + FAST_POLL_WINDOW

    def look_often(self) -> bool:
        """Something on EFS is awaited: a guessed GPU count (for a while) or a joiner."""
        return bool((self.fallback_gpus and time.monotonic() < self.fast_poll_until)
                    or self.pending_join)

    # -- publishing ---------------------------------------------------------------------------
    def publish(self, entries: list[dict], *, reason: str) -> Membership:
        """Publish the next generation with these workers, apply it here, forget departed
        nodes' registrations (so dl-health does not report ghosts)."""
        config = self.agent.config
        efs = self.cluster.efs
        previous = state.read_previous(efs)  # a corrupt membership.json: the last generation
        if previous is not None and previous.cluster_id != config.cluster_id:
            previous = None
        generation = state.latest_generation(efs) + 1
        m = build_membership(
            cluster_id=config.cluster_id, generation=generation, master=self.self_entry(),
            workers=entries, efs_mount=config.mount_point,
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), reason=reason)
        state.publish(efs, m, previous, self.sign)
        if previous is not None:
            for node in previous.nodes:
                if m.node_by_instance(node.instance_id) is None:
                    state.forget_registration(efs, node.instance_id)
        self.log.info("event=publish generation=%d reason=%s nodes=%d addresses=%s", generation,
                      reason, len(m.nodes), ",".join(n.address for n in m.nodes))
        self.agent.apply(m)
        return m

    def rebuild(self, generation: int) -> Membership:
        """Generation ``generation`` again, from the groups (their live instances) and the
        registrations on EFS, for a ``membership.json`` that was lost with its generation
        file: not a new generation, so nothing is logged as added and nobody re-applies.
        Raises SetupFailed when the groups cannot be read."""
        workers = self.discover_workers(self.registered_outsiders())
        registrations = self.read_registrations(w.instance_id for w in workers)
        blockers = {w.instance_id: self.join_blocker(w.instance_id, registrations)
                    for w in workers}
        eligible = [w for w in workers if blockers[w.instance_id] is None]
        self.base_target = policy.base_target(self.agent.config.base_workers, len(eligible))
        base = policy.choose_base(eligible, self.base_target)
        entries, fallback = policy.worker_entries(eligible, registrations, base=base,
                                                  fallback_gpus=self.agent.gpus)
        self.set_fallback(fallback)
        return build_membership(
            cluster_id=self.agent.config.cluster_id, generation=generation,
            master=self.self_entry(), workers=entries, efs_mount=self.agent.config.mount_point,
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), reason="rebuilt")

    def protect(self, m: Membership, only: set[str] | None = None) -> None:
        """Scale-in protection for the master and the base workers (idempotent)."""
        for role, ids in policy.protection_targets(m).items():
            if only is not None:
                ids = [i for i in ids if i in only]
            group = self.group_names.get(role)
            if ids and group:
                self.aws.protect(role, group, ids)

    def resync(self, reason: str, draining: Collection[str]) -> None:
        """Re-read the groups (and hand-started nodes) and publish if the membership changed.

        Members stay while their instance is live and not draining; a newcomer joins only
        once registered and, with a data-preparation hook, prepared."""
        try:
            workers = self.discover_workers(self.registered_outsiders())
        except SetupFailed as exc:
            self.log.error("event=resync-failed error=%s", exc)
            return
        except Exception as exc:
            self.log.warning("event=resync-failed error=%r", exc)
            return
        registrations = self.read_registrations(w.instance_id for w in workers)
        members = {n.instance_id: n for n in (self.current.nodes if self.current else ())}
        blockers = {w.instance_id: self.join_blocker(w.instance_id, registrations)
                    for w in workers
                    if w.instance_id not in draining and w.instance_id not in members}
        eligible, pending = policy.split_workers(workers, members=members, draining=draining,
                                                 blockers=blockers)
        if pending != self.pending_join and pending:
            self.log.info("event=joiners-pending instances=%s", ",".join(sorted(pending)))
        self.pending_join = pending
        if self.base_target is None:
            self.base_target = policy.restored_target(self.agent.config.base_workers, members)
        base = policy.base_after(eligible, members, target=self.base_target,
                                 group_members=self.group_members)
        entries, fallback = policy.worker_entries(eligible, registrations, base=base,
                                                  fallback_gpus=self.agent.gpus)
        candidate = build_membership(
            cluster_id=self.agent.config.cluster_id, generation=1, master=self.self_entry(),
            workers=entries, efs_mount=self.agent.config.mount_point)
        if self.current is not None and candidate.nodes == self.current.nodes:
            self.log.info("event=resync reason=%s unchanged generation=%d", reason,
                          self.current.generation)
            return
        m = self.publish(entries, reason=reason)
        self.set_fallback(fallback | (self.fallback_gpus & set(members)))
        promoted = policy.newly_base(m, members)
        if promoted:
            self.protect(m, only=promoted)

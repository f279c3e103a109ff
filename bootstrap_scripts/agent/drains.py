"""Draining a terminating worker (the master's side): start, watch, complete.

A ``drain-request`` (the worker group's termination lifecycle hook, via the capacity
adjuster) becomes a :class:`~bootstrap_scripts.protocol.records.DrainRecord` at
``cluster/drain/<id>.json``: the node's job executor sees it and stops its shares, the
master publishes a generation without the node. The record is signed with the master's
membership key (``kms:Sign``, the master's role alone): the worker's agent accepts only a
request the master signed and hands its executor a node-local copy
(``bootstrap_scripts.agent.worker``), so a worker that writes a drain record on EFS drains
nobody. When KMS cannot be asked, the record is written unsigned (the master's own
bookkeeping) and signed again at every check until it is. The drain completes when the executor
writes ``cluster/drain/<id>.done`` or at the record's deadline (``--drain-timeout``):
CompleteLifecycleAction CONTINUE, retried with backoff for transient errors, then the
record is rewritten with ``completed_at``, ``reason``, ``outcome`` and ``seconds``. The
records are the state: a restarted master resumes every drain not completed yet, and only
one whose record the master signed (``verify``): a pending record a worker planted on EFS
would otherwise hold a live node out of the membership until its deadline and then forget
its registration. A record that cannot be verified (unsigned because KMS was down when the
last master wrote it, or KMS down now) is not resumed: its lifecycle hook times out and
Auto Scaling goes on with the hook's default result, as for a master that never saw it.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from bootstrap_scripts.agent import policy
from bootstrap_scripts.agent.aws import OUTCOME_LIMIT, MasterAws
from bootstrap_scripts.agent.membership_key import MembershipKeyError
from bootstrap_scripts.node.node_keys import RecordCheck
from bootstrap_scripts.protocol import membership_signature, state, store
from bootstrap_scripts.protocol.membership import Node
from bootstrap_scripts.protocol.membership_signature import Signer, Verifier
from bootstrap_scripts.protocol.messages import DrainRequest
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import DrainDone, DrainRecord

#: Attempts at CompleteLifecycleAction before leaving it to the hook's default (CONTINUE).
COMPLETE_ATTEMPTS = 5


class Drains:
    """The drains in progress (instance id -> record), and the calls that move them on."""

    def __init__(self, cluster: ClusterPaths, aws: MasterAws, *, drain_timeout: float,
                 log: logging.Logger, sign: Signer | None = None,
                 verify: Verifier | None = None, records: RecordCheck | None = None) -> None:
        self.cluster = cluster
        #: a ``.done`` counts only when its node signed it (with node keys: ``node_keys``)
        self.records = records
        self.aws = aws
        self.drain_timeout = drain_timeout
        self.log = log
        self.sign = sign
        self.verify = verify
        self.active: dict[str, DrainRecord] = {}
        #: instance ids whose drain record could not be signed yet (KMS unreachable)
        self.unsigned: set[str] = set()

    def _write(self, record: DrainRecord) -> None:
        """The record on EFS, signed when there is a key; unsigned (and remembered, to be
        signed at the next check) when KMS cannot be asked."""
        try:
            state.write_drain(self.cluster.efs, record, self.sign)
            self.unsigned.discard(record.instance_id)
        except MembershipKeyError as exc:
            state.write_drain(self.cluster.efs, record)
            self.unsigned.add(record.instance_id)
            self.log.warning("event=drain-unsigned instance_id=%s error=%s (the worker does "
                             "not act on it until it is signed; retrying)",
                             record.instance_id, exc)

    def __bool__(self) -> bool:
        return bool(self.active)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self.active

    def resume(self) -> None:
        """Pick up the drains an earlier master left pending (their records on EFS)."""
        self.active = {}
        for iid, record in state.pending_drains(self.cluster.efs).items():
            refused = self.refusal(iid)
            if refused:
                self.log.error("event=drain-not-resumed instance_id=%s reason=%s (only a "
                               "drain record the master signed is resumed)", iid, refused)
            else:
                self.active[iid] = record
        if self.active:
            self.log.info("event=drains-resumed instances=%s", ",".join(sorted(self.active)))

    def refusal(self, instance_id: str) -> str:
        """Why the drain record of ``instance_id`` on EFS is not the master's ("" when its
        signature holds, or when this cluster signs nothing: no key configured)."""
        if self.verify is None:
            return ""
        try:
            text = self.cluster.drain_request(instance_id).read_text()
            return membership_signature.check(text, self.verify, "drain request")
        except MembershipKeyError as exc:
            return f"not checked (the membership key could not be had from KMS): {exc}"
        except (OSError, UnicodeDecodeError) as exc:
            return f"unreadable: {exc}"

    def is_duplicate(self, msg: DrainRequest) -> bool:
        """The same lifecycle action seen before (a redelivered message): changes nothing,
        except that a pending one is tracked again."""
        existing = state.read_drain(self.cluster.efs, msg.instance_id)
        if existing is None or existing.lifecycle_action_token != msg.lifecycle_action_token:
            return False
        if not existing.completed:
            self.active.setdefault(msg.instance_id, existing)
        self.log.info("event=drain-duplicate instance_id=%s", msg.instance_id)
        return True

    def start(self, msg: DrainRequest, *, member: Node | None, address: str, is_master: bool,
              formed: bool) -> bool:
        """Record the drain (the node's executor acts on the file); True when the groups
        must be re-read. Callers check :meth:`is_duplicate` first."""
        iid = msg.instance_id
        now = time.time()
        record = DrainRecord(
            instance_id=iid, address=address, requested_at=now,
            deadline=now + self.drain_timeout, asg=msg.asg, role=msg.role,
            lifecycle_hook=msg.lifecycle_hook,
            lifecycle_action_token=msg.lifecycle_action_token, member=member is not None,
            base=bool(member and member.base))
        self._write(record)
        self.active[iid] = record
        self.log.info("event=drain-start instance_id=%s address=%s member=%s deadline=%.0fs",
                      iid, address or "-", member is not None, self.drain_timeout)
        plan = policy.plan_drain(is_master=is_master, is_member=member is not None,
                                 formed=formed)
        if plan.complete_now == "master":
            self.log.error("event=drain-self (the master cannot drain itself; completing)")
        if plan.complete_now is not None:
            self.complete(iid, plan.complete_now)
        elif member is not None and member.base:
            self.log.warning("event=base-worker-leaving instance_id=%s (protection does not "
                             "stop Spot reclaims, health replacements or manual termination)",
                             iid)
        return plan.resync

    def check(self) -> None:
        """Complete every drain whose node is done or whose deadline passed."""
        for iid in list(self.unsigned):
            record = self.active.get(iid)
            if record is None:
                self.unsigned.discard(iid)
            else:
                self._write(record)
        now = time.time()
        for iid, record in list(self.active.items()):
            reason = policy.drain_due(now=now, deadline=record.deadline,
                                      retry_at=record.retry_at,
                                      done=record.retry_at <= now and self.done(record))
            if reason is not None:
                self.complete(iid, reason)

    def done(self, record: DrainRecord) -> bool:
        """The node's executor says its shares stopped: ``.done`` is there and, when the
        master learns node keys, that node signed it for this very request (a ``.done`` a
        worker forged, or the node's own of an older drain, ends no drain: the deadline
        does)."""
        path = self.cluster.drain_done(record.instance_id)
        if self.records is None or not self.records.active:
            return store.exists(path)
        return self.records.record(path, DrainDone, instance_id=record.instance_id,
                                   what="drain acknowledgement", fields={
                                       "instance_id": record.instance_id,
                                       "requested_at": record.requested_at}) is not None

    def complete(self, iid: str, reason: str) -> None:
        """CompleteLifecycleAction CONTINUE, then mark the drain record completed (or
        schedule another attempt after a transient error)."""
        record = self.active.get(iid) or state.read_drain(self.cluster.efs, iid)
        if record is None:
            self.log.warning("event=drain-complete-skipped instance_id=%s (no drain record)",
                             iid)
            return
        result = self.aws.complete_lifecycle_action(record)
        outcome = result.outcome
        if not result.final:
            attempts = record.attempts + 1
            if attempts < COMPLETE_ATTEMPTS:
                self.active[iid] = dataclasses.replace(
                    record, attempts=attempts,
                    retry_at=time.time() + policy.retry_delay(attempts))
                self.log.warning("event=drain-complete-retry instance_id=%s attempt=%d "
                                 "error=%r", iid, attempts, result.error)
                return
            record = dataclasses.replace(record, attempts=attempts)
            outcome = (f"gave-up (the hook's default CONTINUE applies): "
                       f"{result.error!r}")[:OUTCOME_LIMIT]
        finished = time.time()
        record = dataclasses.replace(
            record, retry_at=0.0, completed_at=finished, reason=reason, result="CONTINUE",
            outcome=outcome, seconds=round(finished - record.requested_at, 3))
        self._write(record)
        self.active.pop(iid, None)
        state.forget_registration(self.cluster.efs, iid)
        self.log.info("event=drain-complete instance_id=%s reason=%s seconds=%.1f outcome=%r",
                      iid, reason, record.seconds, outcome)

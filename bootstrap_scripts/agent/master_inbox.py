"""What the master does with each message of its queue (``asg-setup``, drain requests,
membership changes, and what it cannot parse), in every state that reads the queue.

Kept apart from ``master`` so the state machine and the handling of one message read
apart; :class:`Inbox` is mixed into ``master.Master``, whose attributes it uses (declared
below). Before formation an ``asg-setup`` failure that still holds (the group has not
recovered since: :func:`.policy.setup_failure_holds`) fails the setup (``SetupFailed``);
after it, every message only asks for the groups to be read again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from bootstrap_scripts.agent import policy
from bootstrap_scripts.agent.aws import MasterAws
from bootstrap_scripts.agent.context import AgentContext
from bootstrap_scripts.agent.drains import Drains
from bootstrap_scripts.agent.master_state import GroupSetup, MasterState
from bootstrap_scripts.agent.roster import Roster, SetupFailed
from bootstrap_scripts.agent.settings import AgentConfig
from bootstrap_scripts.protocol import launches
from bootstrap_scripts.protocol.messages import (
    AsgSetup,
    BadMessage,
    DrainRequest,
    MembershipChange,
    Message,
)


class Inbox:
    """The master's handling of its queue's messages (module doc)."""

    agent: AgentContext
    aws: MasterAws
    config: AgentConfig
    log: logging.Logger
    roster: Roster
    drains: Drains
    state: MasterState
    resync_wanted: bool
    _save_state: Callable[[], None]

    def _receive_and_handle(self, wait: int) -> None:
        for receipt, msg in self.aws.receive(wait):
            self.resync_wanted |= self._handle(receipt, msg)

    def _handle(self, receipt: str, msg: Message) -> bool:
        """Process one message and delete it; True when the groups should be re-read.
        Raises SetupFailed for an ``asg-setup`` failure before formation."""
        formed = self.agent.formed.is_set()
        resync = False
        if isinstance(msg, BadMessage):
            self.log.warning("event=skip-message reason=%r body=%r", msg.reason, msg.body[:200])
        elif msg.cluster_id and msg.cluster_id != self.config.cluster_id:
            self.log.warning("event=skip-message reason=other-cluster cluster_id=%r",
                             msg.cluster_id)
        elif isinstance(msg, AsgSetup):
            self.log.info("event=asg-setup role=%s asg=%s status=%s desired=%d launched=%d "
                          "reason=%r", msg.role, msg.asg, msg.status, msg.desired, msg.launched,
                          msg.reason)
            launches.record_attempts(self.agent.cluster, msg)
            if formed:
                resync = True
            elif msg.status == "failure":
                live = self._live_instances(msg.role)
                if policy.setup_failure_holds(failed_min=msg.min, live_now=live):
                    self.aws.delete(receipt)
                    raise SetupFailed(launches.setup_failure_reason(msg))
                self.log.warning("event=asg-setup-failure-outdated role=%s asg=%s live=%s "
                                 "min=%d (the group recovered; waiting for its success)",
                                 msg.role, msg.asg, live, msg.min)
            else:
                kept = {f.name: getattr(msg, f.name) for f in dataclasses.fields(GroupSetup)}
                setup = {**self.state.setup, msg.role: GroupSetup(**kept)}
                self.state = dataclasses.replace(self.state, setup=setup)
                self._save_state()
        elif isinstance(msg, DrainRequest):
            self.log.info("event=drain-request role=%s asg=%s instance_id=%s hook=%s",
                          msg.role, msg.asg, msg.instance_id, msg.lifecycle_hook)
            resync = self._start_drain(msg, formed)
        elif isinstance(msg, MembershipChange):
            self.log.info("event=membership-change role=%s asg=%s change=%s instance_id=%s",
                          msg.role, msg.asg, msg.change, msg.instance_id)
            resync = formed  # before formation, formation reads the groups
        self.aws.delete(receipt)
        return resync

    def _live_instances(self, role: str) -> int | None:
        """The group's live instances now (None when AWS cannot tell: trust the message)."""
        try:
            group = self.aws.group_state(role)
        except Exception as exc:  # discovery or AWS errors: the message stands
            self.log.warning("event=group-read-failed role=%s error=%r", role, exc)
            return None
        if group is None:
            return None
        return len(group.instances) + len(group.missing_address)

    def _start_drain(self, msg: DrainRequest, formed: bool) -> bool:
        if self.drains.is_duplicate(msg):
            return False
        iid = msg.instance_id
        current = self.agent.current
        member = current.node_by_instance(iid) if current else None
        address = member.address if member else ""
        if not address:
            reg = self.roster.read_registrations([iid]).get(iid)
            address = reg.address if reg else ""
        self.roster.pending_join.discard(iid)
        return self.drains.start(msg, member=member, address=address, formed=formed,
                                 is_master=iid == self.agent.identity.instance_id)

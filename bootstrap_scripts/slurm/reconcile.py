"""The signed membership against Slurm's node list: who is DOWN, drained, deleted.

The membership the master signs is the one word on who is in the cluster; Slurm learns of
nodes only from their own slurmd registering. :func:`plan` is the pure table between the two,
run by the master agent after each membership it publishes and on its resync:

- a member absent from Slurm: nothing, its slurmd registers itself (a dynamic node);
- a member being drained (elastic shrink, Spot, scale-in) and not yet DRAIN in Slurm:
  ``DRAIN`` with the reason first, so no new step starts on it;
- a Slurm node that is not a member and not DOWN: ``DOWN`` with "lost: instance <id> left
  the membership (generation N)" at once (the scheduler never waits for ``SlurmdTimeout``),
  then delete; already DOWN: delete;
- a name not of our form (``ip-a-b-c-d``): nothing, an operator added it by hand.

:func:`health_drained` is the second table: the members the health gate's prolog drained
(``bootstrap_scripts.slurm.prolog``), which the master agent marks Unhealthy.

:func:`apply` runs the actions with ``scontrol``; a failure (a node with a step still
completing cannot be deleted yet) is logged and the next pass tries again.

A delete waits while any job is COMPLETING (:func:`completing_jobs`): marking a node DOWN
ends (or requeues) the jobs on it, and a job that also had other nodes stays COMPLETING
until their slurmd report its end; a node deleted meanwhile is still in that job's
resources, and 22.05's slurmctld then dies with a segmentation fault when the job's end
frees them (seen here: a requeued two-node job whose other node was still completing). The
next pass, on the next heartbeat, deletes it.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bootstrap_scripts.protocol.membership import Membership, Node
from bootstrap_scripts.slurm import names

log = logging.getLogger(__name__)

DOWN, DRAIN, DELETE = "down", "drain", "delete"
#: Longest ``scontrol show nodes`` output read (a 4,096-node cluster's is ~4 MB).
MAX_LISTING = 16 * 1024 * 1024
_NODE_RE = re.compile(r"(?:^|\s)NodeName=(\S+)")
_STATE_RE = re.compile(r"(?:^|\s)State=(\S+)")
#: ``Reason=<text> [<user>@<time>]``: Slurm keeps who set a node's reason and when.
_REASON_RE = re.compile(r"(?:^|\s)Reason=(.*?) \[([^\]@\s]*)@[^\]]*\]")
#: How a drain reason of the health gate's prolog starts (``slurm.prolog.REASON_PREFIX``).
HEALTH_PREFIX = "dl-health:"
#: Who may set a node's reason that the master acts on: root (the prolog runs as root on
#: the node) or SlurmUser. Slurm lets no one else update a node (no user is an operator).
REASON_SETTERS = frozenset({"root", "slurm"})


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``scontrol show nodes -o`` lists it: its name and state flags
    (``IDLE+DRAIN+DYNAMIC_NORM`` -> ``{"IDLE", "DRAIN", "DYNAMIC_NORM"}``)."""

    name: str
    states: frozenset[str]
    #: the node's reason, and the user Slurm says set it ("" when none)
    reason: str = ""
    reason_user: str = ""

    @property
    def down(self) -> bool:
        return "DOWN" in self.states

    @property
    def draining(self) -> bool:
        return bool({"DRAIN", "DRAINING", "DRAINED"} & self.states)


@dataclass(frozen=True)
class Action:
    kind: str  # DOWN | DRAIN | DELETE
    node: str
    reason: str = ""


def parse_nodes(text: str) -> list[SlurmNode]:
    """``scontrol show nodes -o`` (one node per line); a line without a name is skipped."""
    nodes = []
    for line in text.splitlines():
        name = _NODE_RE.search(line)
        if not name:
            continue
        state = _STATE_RE.search(line)
        flags = frozenset(state.group(1).upper().replace("*", "").split("+")) if state \
            else frozenset()
        reason = _REASON_RE.search(line)
        nodes.append(SlurmNode(name.group(1), flags, *(reason.groups() if reason else ())))
    return nodes


def lost_reason(instance_id: str, generation: int) -> str:
    return f"lost: instance {instance_id} left the membership (generation {generation})"


def drain_reason(instance_id: str, generation: int) -> str:
    return f"drain: instance {instance_id} is leaving the cluster (generation {generation})"


def plan(membership: Membership, slurm_nodes: Iterable[SlurmNode], *,
         draining: Iterable[str] = (), known: Mapping[str, str] = {}) -> list[Action]:
    """The actions that bring Slurm's node list to ``membership``. ``draining``: instance
    ids the master is draining; ``known``: Slurm node name -> instance id of nodes of
    earlier memberships (to name the instance in a lost node's reason)."""
    members = {names.node_name(n.address): n for n in membership.nodes}
    leaving = set(draining)
    actions: list[Action] = []
    for node in sorted(slurm_nodes, key=lambda n: n.name):
        member = members.get(node.name)
        if member is not None:
            if member.instance_id in leaving and not node.draining and not node.down:
                actions.append(Action(DRAIN, node.name,
                                      drain_reason(member.instance_id, membership.generation)))
            continue
        if names.address_of(node.name) is None:
            continue  # not a name of ours: an operator's node
        if not node.down:
            who = known.get(node.name) or f"at {names.address_of(node.name)}"
            actions.append(Action(DOWN, node.name, lost_reason(who, membership.generation)))
        actions.append(Action(DELETE, node.name))
    return actions


def health_drained(membership: Membership, slurm_nodes: Iterable[SlurmNode]
                   ) -> list[tuple[Node, str]]:
    """Members the health gate's prolog drained, each with the reason's words after the
    prefix (``nvidia-smi exit 9``) (pure): a member of ``membership`` that Slurm lists as
    drained with a ``dl-health:`` reason set by root or SlurmUser; never the master (the
    master agent runs there, and the product never marks it by a job's evidence)."""
    members = {names.node_name(n.address): n for n in membership.nodes}
    out = []
    for node in sorted(slurm_nodes, key=lambda n: n.name):
        member = members.get(node.name)
        if (member is None or member.role == "master" or not node.draining
                or node.reason_user not in REASON_SETTERS
                or not node.reason.startswith(HEALTH_PREFIX)):
            continue
        out.append((member, node.reason[len(HEALTH_PREFIX):].strip()))
    return out


def scontrol_args(action: Action) -> list[str]:
    """``scontrol``'s arguments for one action (no shell: the reason is one argument)."""
    if action.kind == DELETE:
        return ["delete", f"NodeName={action.node}"]
    state = {DOWN: "DOWN", DRAIN: "DRAIN"}[action.kind]
    return ["update", f"NodeName={action.node}", f"State={state}", f"Reason={action.reason}"]


def list_nodes(scontrol: str, env: Mapping[str, str], *, timeout: float = 10.0
               ) -> list[SlurmNode] | None:
    """Slurm's nodes, or None when slurmctld does not answer (the next pass tries again)."""
    try:
        res = subprocess.run([scontrol, "show", "nodes", "-o"], capture_output=True, text=True,
                             env=dict(env), timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("event=slurm-list-failed error=%r", exc)
        return None
    if res.returncode != 0:
        if "No nodes in the system" in res.stdout + res.stderr:
            return []
        log.warning("event=slurm-list-failed status=%d error=%r", res.returncode,
                    res.stderr.strip()[-300:])
        return None
    return parse_nodes(res.stdout[:MAX_LISTING])


def completing_jobs(squeue: str, env: Mapping[str, str], *, timeout: float = 10.0
                    ) -> list[str] | None:
    """The ids of the jobs Slurm is still ending (``COMPLETING``), or None when slurmctld
    does not answer (then nothing is deleted either)."""
    try:
        res = subprocess.run([squeue, "--noheader", "--states=COMPLETING", "--format=%i"],
                             capture_output=True, text=True, env=dict(env), timeout=timeout,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("event=slurm-squeue-failed error=%r", exc)
        return None
    if res.returncode != 0:
        log.warning("event=slurm-squeue-failed status=%d error=%r", res.returncode,
                    res.stderr.strip()[-300:])
        return None
    return res.stdout[:MAX_LISTING].split()


def apply(actions: Sequence[Action], scontrol: str, env: Mapping[str, str], *,
          timeout: float = 10.0) -> list[Action]:
    """Run each action; returns those that succeeded (each one logged either way)."""
    done = []
    for action in actions:
        try:
            res = subprocess.run([scontrol, *scontrol_args(action)], capture_output=True,
                                 text=True, env=dict(env), timeout=timeout, check=False)
            ok, detail = res.returncode == 0, (res.stderr or res.stdout).strip()[-300:]
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, detail = False, repr(exc)
        if ok:
            done.append(action)
            log.debug("event=slurm-%s node=%s reason=%r", action.kind, action.node, action.reason)
        else:
            log.warning("event=slurm-%s-failed node=%s error=%r", action.kind, action.node,
                        detail)
    return done

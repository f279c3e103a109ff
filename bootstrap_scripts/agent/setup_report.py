"""What the wait-condition FAILURE says when the setup runs out of time: what was still missing.

"no asg-setup success for worker group(s) within 3300s" tells an operator that something is
missing, not what. When the master gives up waiting for the groups it gathers, per missing
group, what AWS and EFS know (:func:`.master.Master` collects, this module only words it):

- the Auto Scaling group's name, desired size and live instances (DescribeAutoScalingGroups,
  DescribeInstances), or that no group was found;
- which of those instances registered on EFS and which did not, each with its instance type
  (a node that launched but never registered did not finish its boot: its log is on the
  node, ``/var/log/dl-bootstrap.log``); a node whose registration is there but whose node
  key the master never learnt is named apart: it booted, from user data older than node
  keys, and only replacing it helps (``node_signature.NO_KEY_HINT``);
- the newest launch failure the capacity adjuster reported for that group (zone, types and
  EC2's cause, from ``cluster/launch-failures.json``).

Pure: no AWS call, no file read. CloudFormation keeps at most 4000 characters of a reason
(:data:`~.wait_condition.MAX_REASON`), so long lists are cut with a count.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from bootstrap_scripts.protocol.launches import describe
from bootstrap_scripts.protocol.node_signature import NO_KEY_HINT
from bootstrap_scripts.protocol.records import LaunchAttempt

#: Instances named one by one per list before "and N more".
LISTED = 8


@dataclass(frozen=True)
class GroupSeen:
    """One group as the master could see it when it gave up (``found`` False: no group with
    the cluster's tags, ``error``: it could not be described)."""

    role: str
    found: bool
    name: str = ""
    desired: int = 0
    #: (instance id, instance type) of its live instances.
    instances: tuple[tuple[str, str], ...] = ()
    error: str = ""


def _ids(items: Sequence[tuple[str, str]]) -> str:
    shown = [f"{iid} ({itype or 'type unknown'})" for iid, itype in items[:LISTED]]
    more = len(items) - LISTED
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def group_line(group: GroupSeen, registered: Collection[str],
               failures: Sequence[LaunchAttempt], no_key: Collection[str] = ()) -> str:
    """One missing group: its instances (registered or not) and its newest launch failure.
    ``no_key``: instances whose registration is on EFS but whose node key the master never
    learnt (booted from older user data): they did boot, so "still booting" is not said."""
    if group.error:
        text = f"{group.role} group: could not be described ({group.error})"
    elif not group.found:
        text = f"{group.role} group: not found (no Auto Scaling group tagged for the cluster)"
    else:
        waiting = [i for i in group.instances if i[0] not in registered]
        unkeyed = [i for i in waiting if i[0] in no_key]
        silent = [i for i in waiting if i[0] not in no_key]
        done = len(group.instances) - len(waiting)
        text = (f"{group.role} group {group.name}: {len(group.instances)} of {group.desired} "
                f"instances running, {done} registered")
        if unkeyed:
            text += f"; booted, but no node key learnt from it ({NO_KEY_HINT}): {_ids(unkeyed)}"
        if silent:
            text += f"; not registered (still booting or failed to boot): {_ids(silent)}"
    own = [a for a in failures if a.role == group.role]
    if own:
        text += f"; last launch failure: {describe(own[-1])}"
    return text


def timeout_reason(*, cluster_id: str, timeout: float, missing: Sequence[str],
                   groups: Mapping[str, GroupSeen], registered: Collection[str],
                   failures: Sequence[LaunchAttempt], no_key: Collection[str] = ()) -> str:
    """The FAILURE reason when no ``asg-setup`` success came for ``missing`` in time."""
    head = (f"cluster {cluster_id}: no asg-setup success for {' and '.join(missing)} "
            f"group(s) within {timeout:.0f}s")
    lines = [group_line(groups[role], registered, failures, no_key) for role in missing
             if role in groups]
    return head + ("; " + "; ".join(lines) if lines else "")

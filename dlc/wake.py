"""Waking a master the idle stop stopped (``idleStopMasterMinutes``, docs/capacity.md "Idle
stop").

After the workers, an idle master's controller has the capacity adjuster release the master
group: its minimum, maximum and desired capacity are 0 and no instance is left. ``dlc
status`` says so; ``dlc submit`` and ``dlc up`` set the group back to 1 (the operator
policy's ``WakeThisClustersMaster`` allows exactly that call on exactly that group), then wait
for the new master with a line each time what they see changes, and give up after a bound
naming the last thing seen. The new master takes the formed cluster over from EFS as after
a lost master; the workers stay stopped until a job is queued, when the idle stop's own
resume brings them back, as it does today on a running master.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dlc import aws
from dlc.errors import DlcError
from dlc.target import Target

#: What ``dlc status`` and ``dlc submit`` say about a stopped master.
STOPPED_NOTE = ("the master is stopped (idle stop, idleStopMasterMinutes): dlc up or dlc "
                "submit wakes it")
#: How long ``dlc submit`` waits for a woken master (a GPU instance's boot and install,
#: then its agent taking the cluster over); ``dlc up`` uses its own ``--timeout``.
WAKE_SECONDS = 1200.0
#: Seconds between two looks while waiting.
POLL = 5.0
#: The lifecycle states of an instance on its way in or in the group.
COMING = ("Pending", "Pending:Wait", "Pending:Proceed", "InService")

Echo = Callable[[str], None]


def is_stopped(group: dict) -> bool:
    """The master group as the idle stop leaves it: desired capacity 0 and no instance
    on its way in (one still terminating is the stop finishing)."""
    coming = [i for i in group.get("Instances") or [] if i.get("LifecycleState") in COMING]
    return int(group.get("DesiredCapacity", 0)) == 0 and not coming


def master_group(target: Target, stack: aws.Stack) -> dict:
    return aws.groups(target, stack)["master"]


def start(target: Target, group: dict, echo: Echo) -> None:
    """The one call ``dlc`` makes: the master group back to 1 (minimum, maximum, desired)."""
    name = group["AutoScalingGroupName"]
    echo(f"{STOPPED_NOTE.split(':')[0]}: waking it (master group {name} 0 -> 1)")
    asg = target.client("autoscaling")
    aws.call(f"UpdateAutoScalingGroup {name}", asg.update_auto_scaling_group,
             AutoScalingGroupName=name, MinSize=1, MaxSize=1, DesiredCapacity=1)


def wait(target: Target, name: str, echo: Echo, deadline: float,
         ready: Callable[[str], str]) -> str:
    """Until the master group's instance is InService and ``ready(instance_id)`` says ""
    (else why not yet); returns the instance id. A line each time what is seen changes;
    DlcError naming the last one past ``deadline`` (``time.monotonic()``)."""
    asg = target.client("autoscaling")
    last = ""
    while True:
        found = aws.call(f"DescribeAutoScalingGroups {name}", asg.describe_auto_scaling_groups,
                         AutoScalingGroupNames=[name])["AutoScalingGroups"]
        instances = [i for g in found for i in g.get("Instances") or []
                     if i.get("LifecycleState") in COMING]
        why = "no instance launched yet"
        iid = ""
        if instances:
            iid, state = instances[0]["InstanceId"], instances[0]["LifecycleState"]
            why = f"{iid} {state}"
            if state == "InService":
                not_yet = ready(iid)
                if not not_yet:
                    echo(f"master {iid} is back")
                    return iid
                why = f"{iid} InService, {not_yet}"
        if why != last:
            echo(f"waking the master: {why}")
            last = why
        if time.monotonic() > deadline:
            raise DlcError(f"the master did not come back in time (last seen: {last}); "
                           "dlc status shows the master group and its instance")
        time.sleep(POLL)


def ensure_awake(target: Target, echo: Echo, *, seconds: float = WAKE_SECONDS,
                 ready: Callable[[str], str] | None = None) -> bool:
    """``dlc submit``'s step before it talks to the master: nothing if the master group is
    not stopped; else start it and wait (``ready``: the master answers ``dl-health``).
    True if it woke the master."""
    stack = aws.describe_stack(target)
    group = master_group(target, stack)
    if not is_stopped(group):
        return False
    start(target, group, echo)
    wait(target, group["AutoScalingGroupName"], echo, time.monotonic() + seconds,
         ready or answers(target))
    return True


def answers(target: Target) -> Callable[[str], str]:
    """The master is ready once its ``dl-health`` answers through Run Command (its SSM
    Agent, its installed commands, its agent's files on EFS): "" then, else the reason."""
    from dlc.remote import Remote

    def ready(instance_id: str) -> str:
        try:
            Remote(target, instance_id).json(["dl-health", "--json"], allow_codes=(0, 1))
        except DlcError as exc:
            return f"not answering yet ({str(exc).splitlines()[0][:120]})"
        return ""

    return ready

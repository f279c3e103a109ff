"""Releasing the cluster's instances when the stack is deleted: a custom resource's Delete.

Why it exists: the master agent protects the master and the base workers from scale-in
(the node agent's roster), and nothing else lifts that protection.
CloudFormation never force-deletes an Auto Scaling group: it sets the group's capacity to 0
and waits for the instances to go, and scale-in never takes a protected instance
(https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-instance-protection.html).
A deleted stack (``dlc down``, a plain ``cdk destroy``, the rollback of a failed create)
would wait for hours on the protected instances, then fail with the GPUs still billing.

The stack holds one ``Custom::ClusterRelease`` (the construct of the same name) whose
``Groups`` are the cluster's groups: it depends on them, so CloudFormation deletes it before
either group, and the stack's wait condition depends on it, so it exists before the setup
can fail and a rollback deletes it too. Its Delete, here:

1. lifts scale-in protection from every instance of the groups;
2. sets each group's minimum, maximum and desired capacity to 0, so nothing launches again
   and Auto Scaling takes the instances at once (through the drain hook, as a scale-in);
3. looks again, a bounded number of rounds: the master agent may protect an instance again
   while it publishes a membership, between steps 1 and 2.

The same release serves the master's idle stop (:func:`release_idle_master`): the master's
job controller invokes the function with ``{IDLE_MASTER_KEY: {"Group", "InstanceId"}}``
when the cluster has been idle long enough (the node package's
``jobs/controller/idle_master.py``); the group is released only if it is this cluster's master group
(its tags) and ``InstanceId`` is still in it, so a request that arrives late, after ``dlc``
woke a new master, does nothing.

Create and Update do nothing. The answer goes back through ``cfn_response``. A failed call
answers FAILED with the call and AWS's message, so the stack's deletion stops
at once naming it, instead of CloudFormation's long wait on a protected instance.

Permissions (the stack's ``ClusterRelease`` construct grants them to the capacity adjuster's
role, the function that runs this): ``autoscaling:DescribeAutoScalingGroups``,
``autoscaling:SetInstanceProtection`` and ``autoscaling:UpdateAutoScalingGroup`` on the
groups tagged with the cluster's id.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

try:  # imported as lambda_src.cluster_release (tests, installed package)
    from . import cfn_response
except ImportError:  # imported as cluster_release (Lambda: the asset root is on sys.path)
    import cfn_response  # type: ignore[no-redef]

#: The custom resource's type, as the stack declares it.
RESOURCE_TYPE = "Custom::ClusterRelease"
#: SetInstanceProtection takes at most this many instance ids per call.
PROTECT_BATCH = 50
#: Rounds of step 3 (see the module doc) and the pause between them: well inside the
#: function's timeout.
ROUNDS = 5
ROUND_PAUSE_SECONDS = 2.0


def _groups(event: dict[str, Any]) -> list[str]:
    names = (event.get("ResourceProperties") or {}).get("Groups") or []
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"ResourceProperties.Groups must be a list of group names, got "
                         f"{names!r}")
    return names


def _describe(autoscaling: Any, names: list[str]) -> list[dict[str, Any]]:
    """The groups that still exist (a deleted one is simply absent)."""
    response = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=names)
    return [g for g in response.get("AutoScalingGroups") or []
            if g.get("AutoScalingGroupName") in names]


def protected_in_service(group: dict[str, Any]) -> list[str]:
    """Instances scale-in would never take: protected and not already leaving."""
    return [i["InstanceId"] for i in group.get("Instances") or []
            if i.get("ProtectedFromScaleIn")
            and not str(i.get("LifecycleState", "")).startswith("Terminating")]


def release(autoscaling: Any, names: list[str], *,
            sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Steps 1-3 of the module doc for the groups ``names``; the instances it unprotected.

    Raises what the Auto Scaling client raises; RuntimeError if an instance is still
    protected after every round."""
    released: list[str] = []
    left: list[str] = []
    for round_number in range(ROUNDS):
        groups = _describe(autoscaling, names)
        left = []
        for group in groups:
            name = group["AutoScalingGroupName"]
            ids = protected_in_service(group)
            left += ids
            for start in range(0, len(ids), PROTECT_BATCH):
                autoscaling.set_instance_protection(
                    AutoScalingGroupName=name, InstanceIds=ids[start:start + PROTECT_BATCH],
                    ProtectedFromScaleIn=False)
            released += [i for i in ids if i not in released]
            if ids or (group.get("MinSize"), group.get("MaxSize"),
                       group.get("DesiredCapacity")) != (0, 0, 0):
                autoscaling.update_auto_scaling_group(
                    AutoScalingGroupName=name, MinSize=0, MaxSize=0, DesiredCapacity=0)
        if not left:
            return released
        if round_number + 1 < ROUNDS:
            sleep(ROUND_PAUSE_SECONDS)
    still = [i for g in _describe(autoscaling, names) for i in protected_in_service(g)]
    if still:
        raise RuntimeError(f"still protected from scale-in after {ROUNDS} rounds: "
                           f"{', '.join(still)} (something protects them again)")
    return released


#: The event key of the master's idle-stop request (the node package's twin:
#: ``jobs/controller/idle_master.IDLE_MASTER_KEY``; a contract test holds them together).
IDLE_MASTER_KEY = "dl-idle-master-release"
#: The group tags the request is checked against (the stack's ``NodeType`` value).
MASTER_NODE_TYPE = "Master"


def is_idle_master_request(event: Any) -> bool:
    return isinstance(event, dict) and isinstance(event.get(IDLE_MASTER_KEY), dict)


def release_idle_master(event: dict[str, Any], autoscaling: Any, env: Mapping[str, str], *,
                        sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """The master's idle stop (module doc): :func:`release` of its group, or nothing when
    the group is not this cluster's master group (refused: ValueError) or no longer holds
    the instance that asked (``released`` empty, ``skipped`` says why). ``env``: the
    function's (``CLUSTER_ID``, ``CLUSTER_TAG_KEY``, ``ROLE_TAG_KEY``)."""
    cluster_id, cluster_tag = env.get("CLUSTER_ID", ""), env.get("CLUSTER_TAG_KEY", "")
    role_tag = env.get("ROLE_TAG_KEY", "")
    if not (cluster_id and cluster_tag and role_tag):
        raise ValueError("CLUSTER_ID, CLUSTER_TAG_KEY and ROLE_TAG_KEY must be set")
    body = event[IDLE_MASTER_KEY]
    group, instance = body.get("Group"), body.get("InstanceId")
    if not isinstance(group, str) or not group or not isinstance(instance, str):
        raise ValueError(f"{IDLE_MASTER_KEY} needs Group and InstanceId, got {body!r}")
    found = _describe(autoscaling, [group])
    if not found:
        return {"group": group, "instance": instance, "released": [],
                "skipped": "the group does not exist"}
    tags = {t.get("Key"): t.get("Value") for t in found[0].get("Tags") or []}
    if tags.get(cluster_tag) != cluster_id or tags.get(role_tag) != MASTER_NODE_TYPE:
        raise ValueError(f"{group} is not the master group of cluster {cluster_id} "
                         f"(tags {cluster_tag}={tags.get(cluster_tag)!r}, "
                         f"{role_tag}={tags.get(role_tag)!r})")
    here = {i.get("InstanceId") for i in found[0].get("Instances") or []}
    if instance not in here:
        return {"group": group, "instance": instance, "released": [],
                "skipped": f"{instance} is no longer in the group (a new master runs)"}
    return {"group": group, "instance": instance,
            "released": release(autoscaling, [group], sleep=sleep), "skipped": ""}


def respond(event: dict[str, Any], autoscaling: Any, *,
            sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """The response object for one request (its calls made); never raises."""
    kind = event.get("RequestType")
    answer = cfn_response.body(event)
    try:
        names = _groups(event)
        if kind == "Delete":
            released = release(autoscaling, names, sleep=sleep)
            answer["Reason"] = (f"released {len(released)} protected instance(s) of "
                                f"{', '.join(names)}")
        elif kind not in ("Create", "Update"):
            raise ValueError(f"unknown RequestType {kind!r}")
    except Exception as exc:  # answered, never raised: CloudFormation would wait an hour
        answer = cfn_response.body(event, "FAILED",
                                   f"{RESOURCE_TYPE} {kind}: {type(exc).__name__}: {exc}")
    return answer

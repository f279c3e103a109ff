"""Find this cluster's Auto Scaling groups and their live instances (protocol.md §1).

Groups are recognised by their tags ``dl-cluster:id`` and ``NodeType`` only, never by
substrings of their names (the original matched names, which breaks with two clusters in
one account). Addresses come from EC2's ``PrivateIpAddress``, so the list is right after a
replacement too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

CLUSTER_TAG_KEY = "dl-cluster:id"
ROLE_TAG_KEY = "NodeType"
ROLE_TAG_VALUES = {"master": "Master", "worker": "Worker"}
#: Lifecycle states that will (soon) be part of the cluster.
LIVE_STATES = {"InService", "Pending", "Pending:Wait", "Pending:Proceed"}

log = logging.getLogger(__name__)


class DiscoveryError(RuntimeError):
    """A group could not be found or described; the message names the cluster and role."""


@dataclass(frozen=True)
class Instance:
    instance_id: str
    address: str
    instance_type: str = ""
    #: A Spot instance (EC2 ``InstanceLifecycle``): never chosen as a protected base worker.
    spot: bool = False


@dataclass
class GroupState:
    role: str
    name: str
    desired: int
    instances: list[Instance] = field(default_factory=list)
    #: live per Auto Scaling but without a private IP yet (not usable in a membership).
    missing_address: list[str] = field(default_factory=list)


def find_group(autoscaling, cluster_id: str, role: str) -> dict | None:
    """The group tagged for ``cluster_id`` and ``role``; None if absent; error if ambiguous."""
    filters = [
        {"Name": f"tag:{CLUSTER_TAG_KEY}", "Values": [cluster_id]},
        {"Name": f"tag:{ROLE_TAG_KEY}", "Values": [ROLE_TAG_VALUES[role]]},
    ]
    groups = []
    for page in autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
        Filters=filters
    ):
        groups.extend(page["AutoScalingGroups"])
    if len(groups) > 1:
        names = sorted(g["AutoScalingGroupName"] for g in groups)
        raise DiscoveryError(f"cluster {cluster_id!r} has {len(groups)} {role} groups: {names}")
    return groups[0] if groups else None


def healthy_instance_ids(group: dict) -> list[str]:
    return [
        i["InstanceId"]
        for i in group.get("Instances", [])
        if i.get("LifecycleState") in LIVE_STATES and i.get("HealthStatus", "Healthy") == "Healthy"
    ]


def describe_addresses(ec2, instance_ids: list[str]) -> dict[str, Instance]:
    """Private IPs (and types) of running/pending instances, keyed by instance id."""
    found: dict[str, Instance] = {}
    if not instance_ids:
        return found
    for start in range(0, len(instance_ids), 100):
        chunk = instance_ids[start:start + 100]
        pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=chunk)
        for page in pages:
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    state = inst.get("State", {}).get("Name", "")
                    ip = inst.get("PrivateIpAddress")
                    if state in ("pending", "running") and ip:
                        found[inst["InstanceId"]] = Instance(
                            inst["InstanceId"], ip, inst.get("InstanceType", ""),
                            spot=inst.get("InstanceLifecycle") == "spot",
                        )
    return found


def group_state(autoscaling, ec2, cluster_id: str, role: str) -> GroupState | None:
    group = find_group(autoscaling, cluster_id, role)
    if group is None:
        return None
    ids = healthy_instance_ids(group)
    addresses = describe_addresses(ec2, ids)
    state = GroupState(role=role, name=group["AutoScalingGroupName"],
                       desired=int(group.get("DesiredCapacity", 0)))
    for iid in ids:
        if iid in addresses:
            state.instances.append(addresses[iid])
        else:
            state.missing_address.append(iid)
    return state

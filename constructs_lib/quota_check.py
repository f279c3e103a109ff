"""The stack's own vCPU quota check: ``Custom::QuotaCheck``, created before both groups.

WHY: a fresh account's G and P vCPU quotas are often 0, and ``dlc up`` is not the only
path: a plain ``cdk deploy`` (README's own) would launch groups EC2 refuses with
``VcpuLimitExceeded`` and fail in the setup wait, tens of minutes later. The groups depend
on this resource, so a need above a quota fails the deploy in seconds, naming the quota,
its value, the need and the ``aws service-quotas request-service-quota-increase`` command
(``lambda_src/quota_check.py``; the sum and the table are ``lambda_src/quota_classes.py``,
the ones ``dlc up``'s preflight uses). Spot workers are counted against their class's Spot
quota. The nodes as first launched: the master, ``workerCount`` On-Demand and
``spotWorkers`` Spot workers of each group's preferred type. A Capacity Block's instances
use no On-Demand quota, so a cluster on a block has no check.

The capacity adjuster's function answers (``lambda_src/custom_resources.py``); its role
gains the three read-only calls, none of which takes a resource.
"""

from __future__ import annotations

from aws_cdk import CustomResource
from aws_cdk import aws_iam as iam
from constructs import Construct

from constructs_lib.capacity_adjuster import CapacityAdjuster
from constructs_lib.cluster_props import ClusterProps
from constructs_lib.node_group import NodeGroup

RESOURCE_TYPE = "Custom::QuotaCheck"


def nodes(props: ClusterProps) -> list[dict[str, object]]:
    """The ``Nodes`` property: what launches first, by the keys that ask for it."""
    capacity = props.capacity
    out: list[dict[str, object]] = [
        {"Key": "masterInstanceType", "InstanceType": capacity.master_types[0], "Count": 1,
         "Spot": False},
        {"Key": "workerInstanceType", "InstanceType": capacity.worker_types[0],
         "Count": props.worker_count, "Spot": False}]
    if props.spot_workers:
        out.append({"Key": "spotWorkers", "InstanceType": capacity.worker_types[0],
                    "Count": props.spot_workers, "Spot": True})
    return out


class QuotaCheck(Construct):
    """Fails the deploy before ``groups`` launch when a vCPU quota cannot hold them."""

    def __init__(self, scope: Construct, construct_id: str, *, props: ClusterProps,
                 adjuster: CapacityAdjuster, groups: list[NodeGroup]) -> None:
        super().__init__(scope, construct_id)
        policy = adjuster.role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReadVcpuQuotasAndInstanceTypes",
            actions=["ec2:DescribeInstanceTypes", "servicequotas:GetServiceQuota",
                     "servicequotas:ListAWSDefaultServiceQuotas"],
            resources=["*"]))  # none of these takes a resource (Service Authorization Ref.)
        self.resource = CustomResource(
            self, "Resource", service_token=adjuster.function.function_arn,
            resource_type=RESOURCE_TYPE, properties={"Nodes": nodes(props)})
        if policy.policy_dependable is not None:
            self.resource.node.add_dependency(policy.policy_dependable)
        for group in groups:
            group.auto_scaling_group.node.add_dependency(self.resource)

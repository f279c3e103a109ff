"""The custom resource that lets the stack's deletion end: scale-in protection lifted first.

WHY: CloudFormation deletes an Auto Scaling group by setting its capacity to 0 and waiting;
it never force-deletes, and an instance protected from scale-in (the master and the base
workers: the master agent protects them) keeps that wait going until it fails, hours
later, with the instances still billing. ``Custom::ClusterRelease`` names both groups, so
CloudFormation deletes it before either of them (it deletes a resource only after every
resource that depends on it,
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-attribute-dependson.html),
and its Delete lifts the protection and sets the groups to 0 (``lambda_src/cluster_release.py``).
The stack's wait condition depends on it, so it is created before the setup can fail, and
a rollback deletes it before the groups as well.

The function that answers is the capacity adjuster's (already deployed before the groups,
already scoped to this cluster's groups by their tag): one function fewer, and the same
tag-conditioned grant (``this_clusters_groups``) covers the two calls it adds.
"""

from __future__ import annotations

from aws_cdk import CustomResource
from constructs import Construct

from constructs_lib.capacity_adjuster import CapacityAdjuster, this_clusters_groups
from constructs_lib.idle_stop import NOT_SIZES
from constructs_lib.node_group import NodeGroup

RESOURCE_TYPE = "Custom::ClusterRelease"


class ClusterRelease(Construct):
    """Lifts scale-in protection from ``groups``' instances when the stack deletes them."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_id: str,
                 adjuster: CapacityAdjuster, groups: list[NodeGroup]) -> None:
        super().__init__(scope, construct_id)
        policy = adjuster.role.add_to_principal_policy(this_clusters_groups(
            self, sid="ReleaseThisClustersInstancesAtDeletion", cluster_id=cluster_id,
            actions=["autoscaling:SetInstanceProtection"]))
        # sizes to 0 and nothing else: no template, types, subnets or reservations
        to_zero = this_clusters_groups(
            self, sid="ThisClustersGroupsToZeroAtDeletion", cluster_id=cluster_id,
            actions=["autoscaling:UpdateAutoScalingGroup"])
        to_zero.add_condition("NumericEquals", {"autoscaling:MinSize": "0",
                                                "autoscaling:MaxSize": "0"})
        to_zero.add_condition("Null", {key: "true" for key in NOT_SIZES})
        adjuster.role.add_to_principal_policy(to_zero)
        self.resource = CustomResource(
            self, "Resource", service_token=adjuster.function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties={"Groups": [g.auto_scaling_group.auto_scaling_group_name
                                   for g in groups]})
        # Deleted before the grant: its Delete needs it.
        if policy.policy_dependable is not None:
            self.resource.node.add_dependency(policy.policy_dependable)
        for group in groups:
            self.resource.node.add_dependency(group.auto_scaling_group)

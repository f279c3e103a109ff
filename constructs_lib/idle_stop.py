"""Idle stop: what the master's job controller may do to stop and restart idle workers.

The controller (``bootstrap_scripts.jobs.controller.idle``) scales the worker group to zero
after ``idle_stop_minutes`` with nothing to run, and back when a job is queued. Setting the
desired capacity and lifting scale-in protection the master's role already may do
(``grant_elastic_control``). Only the group's minimum is new: SetDesiredCapacity refuses a
value below it, so the stop lowers the minimum to 0 and the resume puts it back, in one
UpdateAutoScalingGroup each (https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_UpdateAutoScalingGroup.html).

That call can change much more than sizes, so the grant is narrowed by Auto Scaling's own
condition keys (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2autoscaling.html#amazonec2autoscaling-policy-keys):
the worker group of this cluster only (its two tags); a minimum no higher than the one
deployed; and no launch template, launch configuration, instance types, subnets, maximum
or capacity reservation in the request (each key must be absent, ``Null: true``). The
construct adds nothing when the setting is 0.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from constructs_lib import validation
from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY, ROLE_TAG_KEY
from constructs_lib.node_group import NODE_TYPES

#: ``idleStopMinutes``' default: an hour with nothing to run stops the workers.
DEFAULT_IDLE_STOP_MINUTES = 60
#: ``idleStopMasterMinutes``' default: the master stops an hour after the workers did.
#: A wake costs one master boot (minutes, before the workers' own boots that a job needs
#: anyway); an idle g5.xlarge master costs $1.006 an hour (us-east-1), so after two idle
#: hours a night or a weekend bills nothing more (docs/capacity.md "Idle stop").
DEFAULT_IDLE_STOP_MASTER_MINUTES = 60
#: The longest idle time the setting accepts: a week.
MAX_IDLE_STOP_MINUTES = 7 * 24 * 60
#: Keys that must be absent from the controller's UpdateAutoScalingGroup request.
#: UpdateAutoScalingGroup's condition keys of everything but the sizes: a grant that may change
#: sizes only requires each absent (``Null: true``); the stack's release uses it too.
NOT_SIZES = ("autoscaling:LaunchConfigurationName", "autoscaling:LaunchTemplateVersionSpecified",
             "autoscaling:InstanceTypes", "autoscaling:VPCZoneIdentifiers",
             "autoscaling:CapacityReservationIds",
             "autoscaling:CapacityReservationResourceGroupArns")
_ABSENT = (*NOT_SIZES, "autoscaling:MaxSize")


def idle_stop_seconds(name: str, minutes: int) -> int:
    """``minutes`` checked (0: off) as the controller's ``--idle-stop-seconds``."""
    return 60 * validation.count(name, minutes, minimum=0, maximum=MAX_IDLE_STOP_MINUTES)


def grant_master_release(role: iam.IRole, function: lambda_.IFunction) -> None:
    """Let the master (``role``) invoke the capacity adjuster's ``function``, which releases
    the master group when the master's controller asks (``lambda_src/cluster_release``:
    only this cluster's master group, only while the asking instance is in it). The
    function's own ARN only (no version or alias: the stack invokes ``$LATEST``)."""
    role.add_to_principal_policy(iam.PolicyStatement(
        sid="IdleStopOfThisMaster", actions=["lambda:InvokeFunction"],
        resources=[function.function_arn]))


def grant_wake_master(scope: Construct, policy: iam.ManagedPolicy, *, cluster_id: str) -> None:
    """Let ``dlc submit`` / ``dlc up`` (the operator ``policy``) set this cluster's master
    group back to one after its idle stop (``idleStopMasterMinutes``): UpdateAutoScalingGroup
    on the group tagged as this cluster's master, with a minimum and maximum of at most 1
    (the desired capacity cannot exceed the maximum), and nothing else of the group; no
    other group, no other call."""
    policy.add_statements(iam.PolicyStatement(
        sid="WakeThisClustersMaster",
        actions=["autoscaling:UpdateAutoScalingGroup"],
        resources=[Stack.of(scope).format_arn(
            service="autoscaling", resource="autoScalingGroup",
            resource_name="*:autoScalingGroupName/*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME)],
        conditions={
            "StringEquals": {
                f"autoscaling:ResourceTag/{CLUSTER_TAG_KEY}": cluster_id,
                f"autoscaling:ResourceTag/{ROLE_TAG_KEY}": NODE_TYPES["master"],
            },
            "NumericLessThanEquals": {"autoscaling:MinSize": "1", "autoscaling:MaxSize": "1"},
            "Null": {key: "true" for key in NOT_SIZES},
        },
    ))


def grant_idle_stop(scope: Construct, role: iam.IRole, *, cluster_id: str,
                    min_workers: int) -> None:
    """Let ``role`` (the master's) set the worker group's minimum between 0 and
    ``min_workers`` with its desired capacity, and nothing else of the group."""
    role.add_to_principal_policy(iam.PolicyStatement(
        sid="IdleStopOfThisClustersWorkers",
        actions=["autoscaling:UpdateAutoScalingGroup"],
        resources=[Stack.of(scope).format_arn(
            service="autoscaling", resource="autoScalingGroup",
            resource_name="*:autoScalingGroupName/*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME)],
        conditions={
            "StringEquals": {
                f"autoscaling:ResourceTag/{CLUSTER_TAG_KEY}": cluster_id,
                f"autoscaling:ResourceTag/{ROLE_TAG_KEY}": NODE_TYPES["worker"],
            },
            "NumericLessThanEquals": {"autoscaling:MinSize": str(min_workers)},
            "Null": {key: "true" for key in _ABSENT},
        },
    ))

"""A Capacity Block's end, acted on before EC2 acts: ``Custom::CapacityBlockEnd`` and two
EventBridge Scheduler schedules.

WHY: EC2 begins terminating the instances still running in a Capacity Block for ML 30
minutes before the block's end time
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html), outside
any lifecycle hook: a running job's ranks get no SIGTERM from the executor, so its steps
since the last save are lost. The stack knows only the block's id, so:

- ``Custom::CapacityBlockEnd`` (answered by the capacity adjuster's function,
  ``lambda_src/capacity_block.py``) reads the block's end time at deploy time and fails the
  deploy, naming the block, when it is missing, not a Capacity Block, unusable, or ending
  too soon; both groups depend on it, so that happens before anything launches.
- From its attributes, two one-time schedules (``at(...)``, UTC) invoke the same function:
  the workers' group at the end minus ``capacity_block_lead_minutes``, the master's 10
  minutes later. The function lifts scale-in protection and sets the group to 0 (minimum,
  maximum, desired): each worker is drained through the group's hook, which is how the
  product asks a job to checkpoint and stop (SIGTERM to every rank, the job's grace, then
  SIGKILL), and the master, which completes those drains, leaves after them.

Not Auto Scaling scheduled actions (``AWS::AutoScaling::ScheduledAction``): they set the
sizes but never lift scale-in protection, and the master agent protects the master and the
base workers, so a scheduled scale to 0 would leave exactly those running ("Could not scale
to desired capacity because all remaining instances are protected from scale-in",
https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-instance-protection.html).

Permissions: the function's role gains ``ec2:DescribeCapacityReservations`` (no
resource-level permissions: ``nag_suppressions.py`` says so); the release uses the grants of
``Custom::ClusterRelease`` (this cluster's tagged groups only). The schedules' role, which
only EventBridge Scheduler of this account may assume, may invoke that one function.
"""

from __future__ import annotations

from aws_cdk import Aws, CustomResource, Fn, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

from constructs_lib.capacity_adjuster import CapacityAdjuster
from constructs_lib.node_group import NodeGroup
from lambda_src.capacity_block import RESOURCE_TYPE, scheduled_input


class CapacityBlockEnd(Construct):
    """Reads ``block_id``'s end at deploy time; the workers, then the master, leave before
    EC2 terminates them."""

    def __init__(self, scope: Construct, construct_id: str, *, block_id: str,
                 lead_minutes: int, adjuster: CapacityAdjuster, master: NodeGroup,
                 workers: NodeGroup) -> None:
        """
        :param block_id: the Capacity Block (``cr-...``).
        :param lead_minutes: the workers leave this long before the block's end (checked by
            ``launch.check_capacity``).
        :param adjuster: whose function answers and releases, and whose role reads the block.
        :param master: the master's group, released 10 minutes after the workers'.
        :param workers: the workers' group.
        """
        super().__init__(scope, construct_id)
        policy = adjuster.role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReadTheCapacityBlocksEndDate", actions=["ec2:DescribeCapacityReservations"],
            resources=["*"]))  # no resource-level permissions (Service Authorization Ref.)
        self.resource = CustomResource(
            self, "Resource", service_token=adjuster.function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties={"CapacityBlockId": block_id, "LeadMinutes": str(lead_minutes)})
        if policy.policy_dependable is not None:
            self.resource.node.add_dependency(policy.policy_dependable)
        for group in (master, workers):
            group.auto_scaling_group.node.add_dependency(self.resource)
        self.role = iam.Role(
            self, "ScheduleRole", description="EventBridge Scheduler: invokes the capacity "
            "adjuster at the Capacity Block's end",
            assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com", conditions={
                "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}))
        self.role.add_to_principal_policy(iam.PolicyStatement(
            sid="InvokeTheCapacityAdjusterOnly", actions=["lambda:InvokeFunction"],
            resources=[adjuster.function.function_arn]))
        self.schedules: dict[str, scheduler.CfnSchedule] = {}
        for name, label, group, attribute in (
                ("WorkersLeave", "workers", workers, "WorkersStopAt"),
                ("MasterLeaves", "master", master, "MasterStopAt")):
            self.schedules[name] = scheduler.CfnSchedule(
                self, name, description=f"Capacity Block {block_id}: release the {label} "
                "group before EC2 terminates the block's instances",
                flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(
                    mode="OFF"),
                schedule_expression=Fn.join("", [
                    "at(", self.resource.get_att_string(attribute), ")"]),
                schedule_expression_timezone="UTC",
                target=scheduler.CfnSchedule.TargetProperty(
                    arn=adjuster.function.function_arn, role_arn=self.role.role_arn,
                    input=Stack.of(self).to_json_string(scheduled_input(
                        block_id, group.auto_scaling_group.auto_scaling_group_name))))

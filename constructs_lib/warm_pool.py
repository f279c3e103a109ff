"""An Auto Scaling warm pool for the worker group: replacements start, they do not boot.

A GPU node from a Deep Learning AMI takes minutes from launch to a running agent (OS boot,
drivers, the user data's install). A warm pool keeps ``size`` workers that already went
through that once and were then stopped
(https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-warm-pools.html):
when the group needs an instance (a replacement, ``dl-scale`` up) Auto Scaling starts one of
them, and the agent, which systemd starts at boot, joins.

What AWS documents, and how it is met here:

- A warm pool cannot be put on a group with a mixed instances policy or that launches Spot
  Instances (https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_PutWarmPool.html):
  :func:`check` refuses ``spot_capacity`` and an instance-type fallback list at synth.
- Only an instance with an EBS root volume can be stopped
  (https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-warm-pools.html,
  "Limitations"): the node group's launch template always maps an encrypted gp3 EBS volume
  on the root device, so the pool state is ``Stopped``.
- Auto Scaling stops an instance entering the pool as soon as it launched, without waiting
  for its user data, unless a launch lifecycle hook holds it in ``Warmed:Pending:Wait``
  (https://docs.aws.amazon.com/autoscaling/ec2/userguide/warm-pool-instance-lifecycle.html).
  :func:`add_warm_pool` adds that hook (:data:`WARM_HOOK_NAME`, no notification target):
  the node's agent completes it itself once its bootstrap is done. The same hook holds every
  launch of the group again in ``Pending:Wait`` (leaving the pool, or a cold launch when the
  pool is empty), which the agent completes before it registers
  (``bootstrap_scripts.agent.warm_pool``). Default result ABANDON: an instance whose agent
  never said it is ready is terminated, not kept in the pool half installed (cloud-init runs
  user data on the first boot only, so a half-installed instance would never finish).
- Who completes the hook: the master, never the worker. AWS has no condition key tying a
  lifecycle action to the instance that calls CompleteLifecycleAction, so a worker role
  allowed to complete its own action could complete any pending worker's. A worker only
  sends "ready" on the warm-ready queue (:func:`ready_queue`: the workers may only send,
  the master alone receives); the master completes the action of the instance SQS names as
  the message's sender (``SenderId``, ``<role id>:<instance id>``:
  https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html),
  and only for a session of the workers' role (``bootstrap_scripts.agent.warm_ready``).
- Instances are not returned to the pool on scale-in: a drained worker's root disk holds the
  old cluster's membership files and job leftovers, and a fresh pool instance is clean.
- The pool's size is absolute: ``MinSize`` and ``MaxGroupPreparedCapacity`` are both
  ``size`` (API_PutWarmPool: only then is the size fixed rather than the group's maximum
  minus its desired capacity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Duration
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from constructs_lib import validation
from constructs_lib.capacity_adjuster import CLUSTER_TAG_KEY, ROLE_TAG_KEY, this_clusters_groups

if TYPE_CHECKING:  # pragma: no cover
    from constructs_lib.node_group import NodeGroup

#: Name of the worker group's launch lifecycle hook (the agent's ``--launch-hook``).
WARM_HOOK_NAME = "warm-launch"


def check(construct_path: str, size: int, *, spot_capacity: int,
          instance_types: tuple[str, ...] | list[str],
          capacity_block_id: str | None = None) -> int:
    """``size`` if a warm pool of that size can go on the group, else ConfigError naming the
    construct, the key and the value that AWS refuses it with (or, for a Capacity Block,
    why a pool could only waste it)."""
    size = validation.positive_int("warm_pool_size", size, minimum=0)
    if not size:
        return 0
    if capacity_block_id:
        raise validation.ConfigError(
            f"{construct_path}: warm_pool_size={size} cannot be used with "
            f"capacity_block_id={capacity_block_id}: a Capacity Block is paid for its whole "
            "duration and holds a fixed number of instances, so a warm pool's stopped "
            "instances only keep block capacity idle, and EC2 terminates every instance of "
            "the block, pooled ones too, before the block ends")
    if spot_capacity:
        raise validation.ConfigError(
            f"{construct_path}: warm_pool_size={size} cannot be used with "
            f"spot_capacity={spot_capacity}: Auto Scaling refuses a warm pool on a group that "
            "launches Spot Instances (PutWarmPool)")
    if len(instance_types) > 1:
        raise validation.ConfigError(
            f"{construct_path}: warm_pool_size={size} cannot be used with instance-type "
            f"fallbacks {','.join(instance_types)!r}: Auto Scaling refuses a warm pool on a "
            "group with a mixed instances policy (PutWarmPool)")
    return size


def ready_queue(scope: Construct, heartbeat: Duration) -> sqs.Queue:
    """The queue warm-pool workers say they are ready on (SQS-managed encryption, TLS only).
    A message is useful only while its instance's action waits (at most ``heartbeat``), so
    it is kept that long (at least SQS's minimum of 60 s)."""
    return sqs.Queue(scope, "WarmReady", encryption=sqs.QueueEncryption.SQS_MANAGED,
                     enforce_ssl=True, visibility_timeout=Duration.seconds(30),
                     retention_period=Duration.seconds(max(60, heartbeat.to_seconds())))


def add_warm_pool(group: NodeGroup, size: int, *, cluster_id: str, heartbeat: Duration,
                  master: NodeGroup, queue: sqs.IQueue) -> autoscaling.LifecycleHook:
    """A Stopped warm pool of ``size`` on ``group``, the launch hook that holds its
    instances (at most ``heartbeat``: the node boot budget) until ``master`` completes their
    action, and the grants: ``group``'s role may send to ``queue``, ``master``'s role may
    consume it and complete the worker group's lifecycle actions; the hook."""
    pool = group.auto_scaling_group.add_warm_pool(
        min_size=size, max_group_prepared_capacity=size,
        pool_state=autoscaling.PoolState.STOPPED, reuse_on_scale_in=False)
    hook = group.auto_scaling_group.add_lifecycle_hook(
        "WarmLaunchHook",
        lifecycle_hook_name=WARM_HOOK_NAME,
        lifecycle_transition=autoscaling.LifecycleTransition.INSTANCE_LAUNCHING,
        heartbeat_timeout=heartbeat,
        default_result=autoscaling.DefaultResult.ABANDON,
    )
    # The hook first: a pool instance launched before it exists would be stopped in the
    # middle of its user data, which never runs again.
    pool.node.add_dependency(hook)
    queue.grant_send_messages(group.role)
    queue.grant_consume_messages(master.role)
    # The master completes the workers' launch actions. Only groups tagged with this
    # cluster's id and NodeType=Worker.
    statement = this_clusters_groups(
        master, sid="CompleteWorkersLaunchHook", cluster_id=cluster_id,
        actions=["autoscaling:CompleteLifecycleAction"])
    statement.add_condition("StringEquals", {
        f"autoscaling:ResourceTag/{CLUSTER_TAG_KEY}": cluster_id,
        f"autoscaling:ResourceTag/{ROLE_TAG_KEY}": "Worker"})
    master.role.add_to_principal_policy(statement)
    return hook

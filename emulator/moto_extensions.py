"""What the emulator adds to moto so that it answers as AWS does, in one place.

moto plays AWS for the local emulator, but it lacks some attributes and APIs the product's
templates and code use. Each gap is filled here, by extending moto's own models inside the
emulator's moto server process (``emulator.cloud``), never by changing the product to suit
the emulator. :func:`install` is idempotent and is called before the server starts.

Filled gaps (each with the AWS behaviour it reproduces):

- Termination lifecycle hooks (from the template and PutLifecycleHook; ``Terminating:Wait``
  with the hook's notification, CompleteLifecycleAction, RecordLifecycleActionHeartbeat,
  heartbeat timeouts), Spot interruptions, and deleting a group with its hooks:
  ``emulator.lifecycle_hooks``, installed by :func:`install`.
- Launch notifications: a launch of the group's own (a replacement, a higher desired
  capacity) publishes ``autoscaling:EC2_INSTANCE_LAUNCH``, here.
- CloudFormation's side (EFS ``Arn``, ``AWS::Lambda::EventInvokeConfig``, change-set
  outputs, per-resource events, deleting a VPC's route tables and NAT gateway):
  ``emulator.moto_cloudformation``, installed by :func:`install`.
- Notification configurations and publishing to SNS / SQS as Auto Scaling does:
  ``emulator.moto_publishing``, installed by :func:`install`.
- Run Command (``SendCommand`` with ``AWS-RunShellScript``) runs the script on the emulated
  node and ``GetCommandInvocation`` returns its real output: ``emulator.ssm_agent``, installed
  by :func:`install`.
- The Price List API (``GetProducts``, which moto lacks): ``emulator.pricing``, installed by
  :func:`install`.
- EC2's vCPU quotas in Service Quotas, with a new account's values (0 vCPUs of G and P
  instances) and increases: ``emulator.service_quotas``, installed by :func:`install`;
  launches over those quotas fail with ``VcpuLimitExceeded``: ``emulator.vcpu_quotas``.
- Warm pools (filling, warming, drawing on them, DescribeWarmPool's instances) and launch
  lifecycle hooks (``Warmed:Pending:Wait``, ``Pending:Wait``): ``emulator.warm_pool``,
  installed by :func:`install`.
- SQS's ``SenderId``, the principal that signed SendMessage (moto gives every message one
  constant): ``emulator.moto_sqs_sender``, installed by :func:`install`.
- Insufficient capacity (``make demo --capacity-out TYPE[@ZONE]``), Auto Scaling's
  prioritized instance-type fallback and UpdateAutoScalingGroup keeping the mixed instances
  policy and refilling the group: ``emulator.capacity``, installed by :func:`install`.
- CloudFormation's ``AWS::SecretsManager::Secret`` (a given or generated secret string, its
  KMS key; scheduled for deletion with the stack): ``emulator.moto_secrets``, installed by
  :func:`install`.
- Capacity Blocks for ML (a bought block, DescribeCapacityReservations) and CloudFormation's
  ``AWS::Scheduler::Schedule``: ``emulator.capacity_blocks``, installed by :func:`install`.
- Cost Explorer's cost allocation tags (ListCostAllocationTags, UpdateCostAllocationTagsStatus;
  a used key is listed ``Inactive`` until activated): ``emulator.cost_allocation_tags``,
  installed by :func:`install`.
- IAM authorization as AWS evaluates it for the stack's calls (resources of KMS, Auto Scaling
  and CloudWatch Logs calls, role-session principals, policy variables, session tags), off
  until the control endpoint's ``POST /iam-enforcement``: ``emulator.iam_enforcement``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from emulator import (
    capacity,
    capacity_blocks,
    cost_allocation_tags,
    iam_enforcement,
    lifecycle_hooks,
    moto_cloudformation,
    moto_custom_resources,
    moto_emr,
    moto_kms,
    moto_publishing,
    moto_secrets,
    moto_sqs_sender,
    pricing,
    service_quotas,
    ssm_agent,
    ssm_sessions,
    vcpu_quotas,
    warm_pool,
)
from emulator import notifications as nt

#: How often the heartbeat timeouts and Spot reclaims are checked.
TICK_SECONDS = 0.2
_INSTALLED = False


def reset() -> None:
    """Forget actions, reclaims and published messages (with moto's reset of its backends)."""
    lifecycle_hooks.reset()
    ssm_agent.reset()
    ssm_sessions.reset()
    warm_pool.reset()
    moto_publishing.reset()
    capacity.reset()
    iam_enforcement.disable()


# -- the group's own decisions --------------------------------------------------------------


def _wrap_replace_instances(original: Any) -> Any:
    def replace_autoscaling_group_instances(self: Any, count_needed: int,
                                            propagated_tags: dict[str, str]) -> None:
        before = {s.instance.id for s in self.instance_states}
        original(self, count_needed, propagated_tags)
        for state in self.instance_states:
            if state.instance.id not in before:
                moto_publishing.notify(self, nt.LAUNCH, state.instance.id)

    return replace_autoscaling_group_instances


# -- timeouts -------------------------------------------------------------------------------


def _tick() -> None:
    lifecycle_hooks.tick()  # heartbeat timeouts, Spot reclaims (emulator/lifecycle_hooks.py)
    warm_pool.tick()  # launch hooks' heartbeat timeouts (emulator/warm_pool.py)
    capacity.tick()  # groups short after failed launches try again (emulator/capacity.py)


def _ticker() -> None:
    while True:
        time.sleep(TICK_SECONDS)
        try:
            _tick()
        except Exception as exc:  # keep timing out the others
            print(f"moto_extensions: lifecycle tick failed: {exc!r}", flush=True)


def install() -> None:
    """Patch moto's models in this process (the one that runs moto's server)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.autoscaling.models import FakeAutoScalingGroup
    from moto.cloudformation import parsing

    vcpu_quotas.install()  # launches over the vCPU quota fail (emulator/vcpu_quotas.py), innermost
    raw_replace = FakeAutoScalingGroup.replace_autoscaling_group_instances
    lifecycle_hooks.install()  # termination hooks, Spot (emulator/lifecycle_hooks.py)
    FakeAutoScalingGroup.replace_autoscaling_group_instances = _wrap_replace_instances(  # type: ignore[method-assign]
        FakeAutoScalingGroup.replace_autoscaling_group_instances)

    warm_pool.install(raw_replace)  # warm pools and launch hooks (emulator/warm_pool.py)
    moto_cloudformation.install()  # before the model caches are cleared
    moto_secrets.secret_model()  # AWS::SecretsManager::Secret (emulator/moto_secrets.py)
    capacity_blocks.install()  # DescribeCapacityReservations, AWS::Scheduler::Schedule
    cost_allocation_tags.install()  # Cost Explorer's cost allocation tags
    moto_publishing.install()
    for cached in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cached.cache_clear()
    threading.Thread(target=_ticker, daemon=True, name="lifecycle-timeouts").start()
    ssm_agent.install()  # Run Command runs on the emulated nodes (emulator/ssm_agent.py)
    capacity.install()  # insufficient capacity and prioritized type fallback (emulator/capacity.py)
    pricing.install()  # the Price List API's GetProducts (emulator/pricing.py)
    moto_kms.install()  # key policies, signing keys, DIGEST signing (emulator/moto_kms.py)
    moto_custom_resources.install()  # Custom::AWS calls (emulator/moto_custom_resources.py)
    moto_emr.install()  # v2 EMR policies need tagged subnets and groups (emulator/moto_emr.py)
    service_quotas.install()  # EC2's vCPU quotas of a new account (emulator/service_quotas.py)
    moto_sqs_sender.install()  # SQS SenderId names the signer (emulator/moto_sqs_sender.py)
    ssm_sessions.install()  # Session Manager port forwarding (emulator/ssm_sessions.py)
    iam_enforcement.install()  # IAM checks as AWS makes them, once on (emulator/iam_enforcement.py)
    _INSTALLED = True

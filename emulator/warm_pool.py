"""Auto Scaling warm pools and launch lifecycle hooks, added to moto (its server process).

moto 5 stores PutWarmPool's configuration and answers DescribeWarmPool with it, but it
launches nothing into a pool, lists no instance there, and never holds a launching instance
for a launch lifecycle hook. Here, as AWS documents
(https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-warm-pools.html,
https://docs.aws.amazon.com/autoscaling/ec2/userguide/warm-pool-instance-lifecycle.html):

- **Filling.** A group with a warm pool keeps ``max(MinSize, prepared - desired)``
  instances there (``prepared``: ``MaxGroupPreparedCapacity``, or the group's maximum when
  unset or -1), launched from the group's launch template when the pool is created and
  whenever an instance leaves it.
- **Warming.** With an ``EC2_INSTANCE_LAUNCHING`` hook a new pool instance waits in
  ``Warmed:Pending:Wait`` until CompleteLifecycleAction (CONTINUE) or the hook's heartbeat
  timeout with the default result; then it is ``Warmed:Stopped`` and EC2 stops it (ABANDON:
  terminated). Without a hook it is stopped at once.
- **Drawing.** When the group needs instances (a replacement, a higher desired capacity) it
  takes ``Warmed:Stopped`` ones first, EC2 starts them, and only the rest are launched cold.
  With a launch hook every instance entering the group waits in ``Pending:Wait`` until its
  action completes (CONTINUE: ``InService``; ABANDON: terminated and replaced).
- **Describing.** DescribeWarmPool lists the pool's instances with their lifecycle states;
  DeleteWarmPool terminates them. ``AWS::AutoScaling::WarmPool`` deploys through moto's
  CloudFormation.

Instances are never returned to the pool on scale-in (``ReuseOnScaleIn``), as the stack
configures. The emulated EC2 side (the node's boot, its start from ``stopped``, the target
lifecycle state its metadata serves) is ``emulator.autoscaling`` and ``emulator.nodes``.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from emulator import moto_publishing
from emulator import notifications as nt
from emulator.cfn_model import cfn_model

LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"
WARMED_PENDING_WAIT = "Warmed:Pending:Wait"
WARMED_STOPPED = "Warmed:Stopped"
PENDING_WAIT = "Pending:Wait"
CONTINUE, ABANDON = "CONTINUE", "ABANDON"

_LOCK = threading.RLock()
#: (instance id, hook name) -> the launch action holding that instance
_ACTIONS: dict[tuple[str, str], LaunchAction] = {}
_RAW_REPLACE: Any = None  # moto's own launcher, before any wrapper


@dataclass
class LaunchAction:
    """One launch hook holding one instance (``warm``: on its way into the pool)."""

    token: str
    hook: Any  # moto's LifecycleHook
    group: Any  # moto's FakeAutoScalingGroup
    instance_id: str
    deadline: float  # time.monotonic()
    warm: bool


def reset() -> None:
    with _LOCK:
        _ACTIONS.clear()


def pool(group: Any) -> list[Any]:
    """The group's warm pool instances (moto InstanceStates, not in ``instance_states``)."""
    if not hasattr(group, "emulator_warm_pool"):
        group.emulator_warm_pool = []
    return group.emulator_warm_pool


def _launch_hooks(group: Any) -> list[Any]:
    return [h for h in group.autoscaling_backend.lifecycle_hooks.values()
            if h.auto_scaling_group_name == group.name and h.lifecycle_transition == LAUNCHING]


def _ec2(group: Any) -> Any:
    return group.autoscaling_backend.ec2_backend


def _hold(group: Any, state: Any, *, warm: bool) -> bool:
    """Hold ``state`` for each launch hook; False if the group has none."""
    hooks = _launch_hooks(group)
    with _LOCK:
        for hook in hooks:
            _ACTIONS[(state.instance.id, hook.name)] = LaunchAction(
                str(uuid.uuid4()), hook, group, state.instance.id,
                time.monotonic() + hook.heartbeat_timeout, warm)
    return bool(hooks)


def pool_target(group: Any) -> int:
    """How many instances the group's warm pool holds (0 without one)."""
    config = getattr(group, "warm_pool", None)  # not yet while moto builds the group
    if config is None:
        return 0
    prepared = config.max_group_prepared_capacity
    prepared = group.max_size if prepared in (None, -1) else int(prepared)
    return max(int(config.min_size or 0), prepared - int(group.desired_capacity or 0))


def top_up(group: Any) -> None:
    """Launch instances into the pool until it holds :func:`pool_target`."""
    need = pool_target(group) - len(pool(group))
    if need <= 0:
        return
    before = list(group.instance_states)
    _RAW_REPLACE(group, need, group.get_propagated_tags())
    new = [s for s in group.instance_states if s not in before]
    group.instance_states = before
    for state in new:
        pool(group).append(state)
        if _hold(group, state, warm=True):
            state.lifecycle_state = WARMED_PENDING_WAIT
        else:
            _stop(group, state)


def _stop(group: Any, state: Any) -> None:
    state.lifecycle_state = WARMED_STOPPED
    _ec2(group).stop_instances([state.instance.id])


def _wrap_replace(wrapped: Any) -> Any:
    def replace_autoscaling_group_instances(self: Any, count_needed: int,
                                            propagated_tags: dict[str, str]) -> None:
        """Draw on the warm pool first; hold every new instance for the launch hooks."""
        hooked = bool(_launch_hooks(self))
        if hooked:  # moto counts InService only: instances held for a hook count too
            count_needed -= sum(1 for s in self.instance_states
                                if s.lifecycle_state in (PENDING_WAIT, "Pending"))
        if count_needed <= 0:
            return
        ready = [s for s in pool(self) if s.lifecycle_state == WARMED_STOPPED][:count_needed]
        for state in ready:
            pool(self).remove(state)
            _ec2(self).start_instances([state.instance.id])
            state.lifecycle_state = "InService"
            self.instance_states.append(state)
            moto_publishing.notify(self, nt.LAUNCH, state.instance.id)
        before = {s.instance.id for s in self.instance_states}
        if count_needed > len(ready):
            wrapped(self, count_needed - len(ready), propagated_tags)
        entering = ready + [s for s in self.instance_states if s.instance.id not in before]
        for state in entering:
            if _hold(self, state, warm=False):
                state.lifecycle_state = PENDING_WAIT
        top_up(self)

    return replace_autoscaling_group_instances


def _wrap_put_warm_pool(original: Any) -> Any:
    def put_warm_pool(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        top_up(self)

    return put_warm_pool


def _wrap_delete_warm_pool(original: Any) -> Any:
    def delete_warm_pool(self: Any, group_name: str) -> None:
        group = self.autoscaling_groups[group_name]
        ids = [s.instance.id for s in pool(group)]
        with _LOCK:
            for key in [k for k in _ACTIONS if k[0] in ids]:
                del _ACTIONS[key]
        pool(group).clear()
        if ids:
            self.ec2_backend.terminate_instances(ids)
        original(self, group_name)

    return delete_warm_pool


def _wrap_delete_group(original: Any) -> Any:
    def delete_auto_scaling_group(self: Any, group_name: str) -> None:
        """Deleting a group terminates its warm pool too (and its launch actions)."""
        group = self.autoscaling_groups.get(group_name)
        if group is not None and pool(group):
            _wrap_delete_warm_pool(lambda *_a: None)(self, group_name)
        original(self, group_name)

    return delete_auto_scaling_group


def finish(action: LaunchAction, result: str) -> None:
    """One launch action ends: once none holds the instance it moves on (ABANDON: at once,
    to termination)."""
    with _LOCK:
        _ACTIONS.pop((action.instance_id, action.hook.name), None)
        others = [k for k in _ACTIONS if k[0] == action.instance_id]
        if result == ABANDON:
            for key in others:
                del _ACTIONS[key]
            others = []
    if others:
        return
    group = action.group
    if action.warm:
        state = next((s for s in pool(group) if s.instance.id == action.instance_id), None)
        if state is None:
            return
        if result == CONTINUE:
            _stop(group, state)
            return
        pool(group).remove(state)
        _ec2(group).terminate_instances([action.instance_id])
        top_up(group)
        return
    state = next((s for s in group.instance_states if s.instance.id == action.instance_id),
                 None)
    if state is None:
        return
    if result == CONTINUE:
        state.lifecycle_state = "InService"
        return
    group.instance_states = [s for s in group.instance_states if s is not state]
    _ec2(group).terminate_instances([action.instance_id])
    moto_publishing.notify(group, nt.TERMINATE, action.instance_id)
    group.set_desired_capacity(group.desired_capacity)  # the replacement


def _wrap_complete(original: Any) -> Any:
    def complete_lifecycle_action(self: Any) -> Any:
        """A launch action of this module, or the termination actions' handler."""
        from moto.core.responses import EmptyResult

        hook_name, group_name = (self._get_param("LifecycleHookName"),
                                 self._get_param("AutoScalingGroupName"))
        token, iid = self._get_param("LifecycleActionToken"), self._get_param("InstanceId")
        with _LOCK:
            action = next((a for a in _ACTIONS.values()
                           if a.group.autoscaling_backend is self.autoscaling_backend
                           and a.group.name == group_name and a.hook.name == hook_name
                           and ((token and a.token == token)
                                or (not token and a.instance_id == iid))), None)
        if action is None:
            return original(self)
        result = self._get_param("LifecycleActionResult")
        if result not in (CONTINUE, ABANDON):
            from moto.autoscaling.exceptions import ValidationError

            raise ValidationError(f"Invalid LifecycleActionResult {result!r}")
        finish(action, result)
        return EmptyResult()

    return complete_lifecycle_action


def describe_warm_pool(self: Any) -> Any:
    """DescribeWarmPool with the pool's instances."""
    from moto.core.responses import ActionResult

    name = self._get_param("AutoScalingGroupName")
    group = self.autoscaling_backend.autoscaling_groups.get(name)
    if group is None:  # moto would fail with a server error (which clients retry)
        from moto.autoscaling.exceptions import ValidationError

        raise ValidationError(f"AutoScalingGroup name not found - {name}")
    config = self.autoscaling_backend.describe_warm_pool(group_name=name)
    instances = [{"InstanceId": s.instance.id, "InstanceType": s.instance.instance_type,
                  "AvailabilityZone": s.instance.placement.zone,
                  "LifecycleState": s.lifecycle_state, "HealthStatus": "Healthy"}
                 for s in pool(group)]
    return ActionResult({"WarmPoolConfiguration": config, "Instances": instances})


def tick() -> None:
    """Heartbeat timeouts of launch actions: the hook's default result."""
    now = time.monotonic()
    with _LOCK:
        expired = [a for a in _ACTIONS.values() if a.deadline <= now]
    for action in expired:
        finish(action, action.hook.default_result)


def _warm_pool_model() -> type:
    """``AWS::AutoScaling::WarmPool`` for moto's CloudFormation."""
    from moto.autoscaling.models import autoscaling_backends

    def create(resource_name: str, p: dict[str, Any], account_id: str, region: str) -> str:
        autoscaling_backends[account_id][region].put_warm_pool(
            group_name=p["AutoScalingGroupName"],
            max_group_prepared_capacity=p.get("MaxGroupPreparedCapacity"),
            min_size=p.get("MinSize"), pool_state=p.get("PoolState"),
            instance_reuse_policy=p.get("InstanceReusePolicy"))
        return p["AutoScalingGroupName"]

    def delete(resource_name: str, p: dict[str, Any], account_id: str, region: str) -> None:
        backend = autoscaling_backends[account_id][region]
        name = p.get("AutoScalingGroupName")
        if not isinstance(name, str):  # an unresolved Ref: the physical id is the group's
            name = resource_name
        if name in backend.autoscaling_groups:
            backend.delete_warm_pool(name)

    return cfn_model("AWS::AutoScaling::WarmPool", create=create, delete=delete)


def install(raw_replace: Any) -> None:
    """Patch moto (after ``emulator.moto_extensions`` wrapped the group's launcher and
    CompleteLifecycleAction); ``raw_replace``: moto's own launcher, which fills pools without
    a launch notification. The caller clears CloudFormation's model caches."""
    global _RAW_REPLACE
    from moto.autoscaling.models import AutoScalingBackend, FakeAutoScalingGroup
    from moto.autoscaling.responses import AutoScalingResponse

    if _RAW_REPLACE is not None:
        return
    _RAW_REPLACE = raw_replace
    FakeAutoScalingGroup.replace_autoscaling_group_instances = _wrap_replace(  # type: ignore[method-assign]
        FakeAutoScalingGroup.replace_autoscaling_group_instances)
    FakeAutoScalingGroup.put_warm_pool = _wrap_put_warm_pool(  # type: ignore[method-assign]
        FakeAutoScalingGroup.put_warm_pool)
    AutoScalingBackend.delete_warm_pool = _wrap_delete_warm_pool(  # type: ignore[method-assign]
        AutoScalingBackend.delete_warm_pool)
    AutoScalingBackend.delete_auto_scaling_group = _wrap_delete_group(  # type: ignore[method-assign]
        AutoScalingBackend.delete_auto_scaling_group)
    AutoScalingResponse.complete_lifecycle_action = _wrap_complete(  # type: ignore[attr-defined]
        AutoScalingResponse.complete_lifecycle_action)
    AutoScalingResponse.describe_warm_pool = describe_warm_pool  # type: ignore[method-assign]
    _warm_pool_model()

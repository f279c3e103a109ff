"""Auto Scaling's termination lifecycle hooks, Spot interruptions and deleting a group with
its hooks, added to moto's models (part of ``emulator.moto_extensions``, which calls
:func:`install`, :func:`tick` and :func:`reset`).

- Lifecycle hooks (https://docs.aws.amazon.com/autoscaling/ec2/userguide/lifecycle-hooks.html).
  moto ignores ``AWS::AutoScaling::LifecycleHook``, stores neither a hook's notification
  target nor its role, never holds an instance in a wait state and has no
  ``CompleteLifecycleAction``. Here:

  * the resource creates the hook (target, role, metadata, timeout, default result), and
    PutLifecycleHook keeps what it is given; creating a hook with a target publishes
    ``autoscaling:TEST_NOTIFICATION`` there, as AWS does;
  * an instance leaving its group (SetDesiredCapacity lower, or
    TerminateInstanceInAutoScalingGroup) while the group has termination hooks goes to
    ``Terminating:Wait``, and each hook's notification (no ``Event``; ``LifecycleTransition``,
    ``LifecycleActionToken``, ...; the shape of
    https://docs.aws.amazon.com/autoscaling/ec2/userguide/prepare-for-lifecycle-notifications.html)
    is published to the hook's target, an SNS topic or an SQS queue;
  * ``CompleteLifecycleAction`` (by token or instance id) with CONTINUE or ABANDON, or the
    heartbeat timeout (``RecordLifecycleActionHeartbeat`` restarts it) applying the hook's
    ``DefaultResult``, moves the instance to ``Terminating:Proceed`` and terminates it: for a
    termination both results terminate, ABANDON skips the remaining hooks
    (https://docs.aws.amazon.com/autoscaling/ec2/userguide/completing-lifecycle-hooks.html).
    An action that is no longer waiting answers ``ValidationError`` "No active Lifecycle
    Action found with instance ID ...", as Auto Scaling does.
- A Spot interruption (:func:`spot_interruption`, the control endpoint's
  ``POST /spot-interruption``): Auto Scaling takes the instance out of service through its
  termination hooks and launches a replacement (desired capacity unchanged), and EC2
  reclaims the instance two minutes after the notice whatever the hooks wait for
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
- Deleting a group deletes its hooks and outstanding lifecycle actions first, then:
  DeleteAutoScalingGroup with ``ForceDelete`` terminates every instance, protected ones
  too; without it, a group with instances is refused (``ResourceInUse``,
  https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DeleteAutoScalingGroup.html);
  a stack's deletion (CloudFormation never force-deletes: it scales the group to 0 and
  waits) terminates the unprotected instances and fails while an instance protected from
  scale-in remains (:class:`ProtectedInstancesRemain`; ``emulator.cfn_deletion`` makes the
  stack ``DELETE_FAILED``), where AWS waits for hours before failing.
"""

from __future__ import annotations

import contextvars
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from emulator import moto_publishing
from emulator import notifications as nt
from emulator.cfn_model import cfn_model

#: EC2's Spot interruption notice: the instance is reclaimed this long after it.
SPOT_NOTICE_SECONDS = 120.0
CONTINUE, ABANDON = "CONTINUE", "ABANDON"

_LOCK = threading.RLock()
_ACTIONS: dict[str, LifecycleAction] = {}  # token -> the action waiting for it
_RECLAIMS: dict[str, tuple[float, Any]] = {}  # instance id -> (monotonic time, group)
#: How the group being deleted is deleted: "force" (ForceDelete, and direct backend calls),
#: "api" (DeleteAutoScalingGroup without ForceDelete), "cloudformation" (a stack's deletion).
_DELETE_MODE: contextvars.ContextVar[str] = contextvars.ContextVar("delete_mode",
                                                                  default="force")


class ProtectedInstancesRemain(RuntimeError):
    """A stack's deletion of a group that still has instances protected from scale-in."""


@dataclass
class LifecycleAction:
    """One hook holding one instance in ``Terminating:Wait``."""

    token: str
    hook: Any  # moto's LifecycleHook
    group: Any  # moto's FakeAutoScalingGroup
    instance_id: str
    deadline: float  # time.monotonic()


# -- lifecycle hooks ------------------------------------------------------------------------


def _create_lifecycle_hook(self: Any, name: str, as_name: str, transition: str,
                           timeout: int | None, result: str, target: str | None = None,
                           role: str | None = None, metadata: str | None = None) -> Any:
    """moto's PutLifecycleHook, keeping the target, role and metadata it drops."""
    from moto.autoscaling.models import LifecycleHook

    hook = LifecycleHook(name, as_name, transition, timeout, result)
    hook.notification_target_arn = target
    hook.role_arn = role
    hook.notification_metadata = metadata
    self.lifecycle_hooks[f"{as_name}_{name}"] = hook
    group = self.autoscaling_groups.get(as_name)
    if target and group is not None:
        moto_publishing.publish(group, target, nt.test_notification(as_name))
    return hook


def _put_lifecycle_hook(self: Any) -> Any:
    from moto.core.responses import EmptyResult

    self.autoscaling_backend.create_lifecycle_hook(
        name=self._get_param("LifecycleHookName"),
        as_name=self._get_param("AutoScalingGroupName"),
        transition=self._get_param("LifecycleTransition"),
        timeout=self._get_int_param("HeartbeatTimeout"),
        result=self._get_param("DefaultResult"),
        target=self._get_param("NotificationTargetARN"),
        role=self._get_param("RoleARN"),
        metadata=self._get_param("NotificationMetadata"))
    return EmptyResult()


def _hook_model() -> type:
    """``AWS::AutoScaling::LifecycleHook`` for moto's CloudFormation."""
    from moto.autoscaling.models import autoscaling_backends

    def create(resource_name: str, p: dict[str, Any], account_id: str, region: str) -> str:
        timeout = p.get("HeartbeatTimeout")
        return autoscaling_backends[account_id][region].create_lifecycle_hook(
            name=p.get("LifecycleHookName") or resource_name,
            as_name=p["AutoScalingGroupName"], transition=p["LifecycleTransition"],
            timeout=int(timeout) if timeout is not None else None,
            result=p.get("DefaultResult"), target=p.get("NotificationTargetARN"),
            role=p.get("RoleARN"), metadata=p.get("NotificationMetadata")).name

    def delete(resource_name: str, p: dict[str, Any], account_id: str, region: str) -> None:
        autoscaling_backends[account_id][region].delete_lifecycle_hook(
            p["AutoScalingGroupName"], p.get("LifecycleHookName") or resource_name)

    return cfn_model("AWS::AutoScaling::LifecycleHook", name_type="LifecycleHookName",
                     create=create, delete=delete)


def _termination_hooks(group: Any) -> list[Any]:
    return [h for h in group.autoscaling_backend.lifecycle_hooks.values()
            if h.auto_scaling_group_name == group.name
            and h.lifecycle_transition == nt.TERMINATING]


def _begin_termination(group: Any, state: Any) -> None:
    """Take ``state``'s instance out of service: through the hooks, or at once."""
    hooks = _termination_hooks(group)
    if not hooks:
        _terminate(group, state.instance.id)
        return
    with _LOCK:
        state.lifecycle_state = "Terminating:Wait"
        for hook in hooks:
            token = str(uuid.uuid4())
            _ACTIONS[token] = LifecycleAction(token, hook, group, state.instance.id,
                                              time.monotonic() + hook.heartbeat_timeout)
    for action in [a for a in list(_ACTIONS.values()) if a.instance_id == state.instance.id]:
        if action.hook.notification_target_arn:
            moto_publishing.publish(
                group, action.hook.notification_target_arn, nt.lifecycle_notification(
                    group.name, action.instance_id, hook=action.hook.name, token=action.token,
                    metadata=action.hook.notification_metadata))


def _terminate(group: Any, instance_id: str) -> None:
    """The instance leaves the group and EC2 terminates it; TERMINATE is published."""
    with _LOCK:
        for state in group.instance_states:
            if state.instance.id == instance_id:
                state.lifecycle_state = "Terminating:Proceed"
        group.instance_states = [s for s in group.instance_states
                                 if s.instance.id != instance_id]
        _RECLAIMS.pop(instance_id, None)
    group.autoscaling_backend.ec2_backend.terminate_instances([instance_id])
    moto_publishing.notify(group, nt.TERMINATE, instance_id)


def _finish(action: LifecycleAction, result: str) -> None:
    """One hook's action ends with ``result``: the instance terminates once none waits
    (at once with ABANDON, which skips the other hooks)."""
    with _LOCK:
        _ACTIONS.pop(action.token, None)
        others = [a for a in _ACTIONS.values() if a.instance_id == action.instance_id]
        if result == ABANDON:
            for other in others:
                _ACTIONS.pop(other.token, None)
            others = []
    if not others:
        _terminate(action.group, action.instance_id)


def _find_action(backend: Any, group_name: str, hook_name: str, token: str | None,
                 instance_id: str | None) -> LifecycleAction | None:
    with _LOCK:
        for action in _ACTIONS.values():
            if action.group.autoscaling_backend is not backend or \
                    action.group.name != group_name or action.hook.name != hook_name:
                continue
            if (token and action.token == token) or (not token and
                                                     action.instance_id == instance_id):
                return action
    return None


def _no_action(instance_id: str | None, token: str | None) -> Exception:
    from moto.autoscaling.exceptions import ValidationError

    if instance_id:
        return ValidationError(f"No active Lifecycle Action found with instance ID "
                               f"{instance_id}")
    return ValidationError(f"No active Lifecycle Action found with token {token}")


def _complete_lifecycle_action(self: Any) -> Any:
    from moto.autoscaling.exceptions import ValidationError
    from moto.core.responses import EmptyResult

    result = self._get_param("LifecycleActionResult")
    if result not in (CONTINUE, ABANDON):
        raise ValidationError(f"Invalid LifecycleActionResult {result!r}: "
                              "CONTINUE or ABANDON")
    token, iid = self._get_param("LifecycleActionToken"), self._get_param("InstanceId")
    action = _find_action(self.autoscaling_backend, self._get_param("AutoScalingGroupName"),
                          self._get_param("LifecycleHookName"), token, iid)
    if action is None or (iid and action.instance_id != iid):
        raise _no_action(iid, token)
    _finish(action, result)
    return EmptyResult()


def _record_lifecycle_action_heartbeat(self: Any) -> Any:
    from moto.core.responses import EmptyResult

    token, iid = self._get_param("LifecycleActionToken"), self._get_param("InstanceId")
    action = _find_action(self.autoscaling_backend, self._get_param("AutoScalingGroupName"),
                          self._get_param("LifecycleHookName"), token, iid)
    if action is None:
        raise _no_action(iid, token)
    with _LOCK:
        action.deadline = time.monotonic() + action.hook.heartbeat_timeout
    return EmptyResult()


# -- the group's own decisions --------------------------------------------------------------


def _wrap_set_desired_capacity(original: Any) -> Any:
    def set_desired_capacity(self: Any, new_capacity: int | None) -> None:
        """A lower capacity takes the excess out of service through the hooks first; moto
        then finds the group at its desired size."""
        desired = self.min_size if new_capacity is None else new_capacity
        in_service = [s for s in self.instance_states if s.lifecycle_state == "InService"]
        excess = len(in_service) - int(desired or 0)
        if excess > 0:
            for state in [s for s in in_service if not s.protected_from_scale_in][:excess]:
                _begin_termination(self, state)
        original(self, new_capacity)

    return set_desired_capacity


def _terminate_instance(self: Any, instance_id: str, should_decrement: bool) -> Any:
    """TerminateInstanceInAutoScalingGroup through the group's termination hooks."""
    from moto.autoscaling.models import TerminateInstanceActivity

    state = next((s for g in self.autoscaling_groups.values() for s in g.instance_states
                  if s.instance.id == instance_id), None)
    if state is None:
        from moto.autoscaling.exceptions import ValidationError

        raise ValidationError(f"Instance Id not found - No managed instance found for "
                              f"instance ID: {instance_id}")
    group = state.instance.autoscaling_group
    original_size = group.desired_capacity
    if state.lifecycle_state == "InService":
        if should_decrement:
            group.desired_capacity = original_size - 1
        _begin_termination(group, state)
        group.set_desired_capacity(group.desired_capacity)  # a replacement, if not lowered
    return TerminateInstanceActivity(state.instance, original_size)


def _wrap_delete_group(original: Any) -> Any:
    def delete_auto_scaling_group(self: Any, group_name: str) -> None:
        """Deleting a group deletes its lifecycle hooks and outstanding lifecycle actions
        (CloudFormation deletes a group's hooks before the group), then deletes it as the
        caller asked (:data:`_DELETE_MODE`, see the module doc)."""
        from moto.autoscaling.exceptions import AutoscalingClientError

        group = self.autoscaling_groups.get(group_name)
        mode = _DELETE_MODE.get()
        if mode == "api" and group is not None and group.instance_states:
            raise AutoscalingClientError(
                "ResourceInUse", "You cannot delete an AutoScalingGroup while there are "
                "instances or pending Spot instance request(s) still in the group.")
        for key in [k for k, h in self.lifecycle_hooks.items()
                    if h.auto_scaling_group_name == group_name]:
            del self.lifecycle_hooks[key]
        with _LOCK:
            waiting = [a for a in _ACTIONS.values() if a.group.name == group_name
                       and a.group.autoscaling_backend is self]
            for action in waiting:
                _ACTIONS.pop(action.token, None)
        for action in {a.instance_id: a for a in waiting}.values():
            _terminate(action.group, action.instance_id)
        states = list(group.instance_states if group is not None else [])
        protected = [s for s in states if mode == "cloudformation"
                     and s.protected_from_scale_in and s.lifecycle_state == "InService"]
        for state in states:  # moto's own delete would spare protected ones, left running
            if state not in protected:
                _terminate(group, state.instance.id)
        if protected:
            group.min_size = group.max_size = group.desired_capacity = 0
            raise ProtectedInstancesRemain(
                f"AutoScalingGroup {group_name}: scaled to 0, but its instance(s) "
                f"{', '.join(s.instance.id for s in protected)} are protected from scale-in "
                f"(CloudFormation never force-deletes a group; lift the protection)")
        original(self, group_name)

    return delete_auto_scaling_group


def _group_cfn_delete(self: Any, account_id: str, region_name: str) -> None:
    """A stack's deletion of the group: CloudFormation's way (never ForceDelete)."""
    from moto.autoscaling.models import autoscaling_backends

    token = _DELETE_MODE.set("cloudformation")
    try:
        autoscaling_backends[account_id][region_name].delete_auto_scaling_group(self.name)
    finally:
        _DELETE_MODE.reset(token)


def _delete_group_response(self: Any) -> Any:
    """DeleteAutoScalingGroup: ``ForceDelete`` decides what happens to the instances."""
    from moto.core.responses import ActionResult, EmptyResult

    force = str(self._get_param("ForceDelete", False)).lower() == "true"
    token = _DELETE_MODE.set("force" if force else "api")
    try:
        self.autoscaling_backend.delete_auto_scaling_group(
            self._get_param("AutoScalingGroupName"))
    finally:
        _DELETE_MODE.reset(token)
    result: ActionResult = EmptyResult()
    return result


# -- Spot interruptions and timeouts --------------------------------------------------------


def spot_interruption(instance_id: str, account: str, region: str) -> dict:
    """EC2 interrupts the Spot instance ``instance_id`` of a group (see the module doc)."""
    from moto.autoscaling.models import autoscaling_backends

    backend = autoscaling_backends[account][region]
    for group in backend.autoscaling_groups.values():
        for state in group.instance_states:
            if state.instance.id == instance_id and state.lifecycle_state == "InService":
                with _LOCK:
                    _RECLAIMS[instance_id] = (time.monotonic() + SPOT_NOTICE_SECONDS, group)
                _begin_termination(group, state)
                group.set_desired_capacity(group.desired_capacity)  # the replacement
                return {"instance_id": instance_id, "group": group.name,
                        "reclaim_in_s": SPOT_NOTICE_SECONDS}
    raise KeyError(f"no in-service group instance {instance_id}")


def tick() -> None:
    """Heartbeat timeouts apply their hook's default result; Spot instances past their
    notice are reclaimed whatever their hooks wait for."""
    now = time.monotonic()
    with _LOCK:
        expired = [a for a in _ACTIONS.values() if a.deadline <= now]
        reclaims = [(iid, g) for iid, (at, g) in _RECLAIMS.items() if at <= now]
    for action in expired:
        if action.token in _ACTIONS:
            _finish(action, action.hook.default_result)
    for iid, group in reclaims:
        with _LOCK:
            for action in [a for a in _ACTIONS.values() if a.instance_id == iid]:
                _ACTIONS.pop(action.token, None)
        _terminate(group, iid)


def reset() -> None:
    """Forget outstanding actions and reclaims (with moto's reset of its backends)."""
    with _LOCK:
        _ACTIONS.clear()
        _RECLAIMS.clear()


def install() -> None:
    """Patch moto's Auto Scaling models and responses (``moto_extensions.install``, before
    ``emulator.warm_pool`` wraps CompleteLifecycleAction for launch hooks)."""
    from moto.autoscaling.models import AutoScalingBackend, FakeAutoScalingGroup
    from moto.autoscaling.responses import AutoScalingResponse

    AutoScalingBackend.create_lifecycle_hook = _create_lifecycle_hook  # type: ignore[method-assign]
    AutoScalingBackend.terminate_instance = _terminate_instance  # type: ignore[method-assign]
    AutoScalingBackend.delete_auto_scaling_group = _wrap_delete_group(  # type: ignore[method-assign]
        AutoScalingBackend.delete_auto_scaling_group)
    FakeAutoScalingGroup.delete = _group_cfn_delete  # type: ignore[method-assign]
    AutoScalingResponse.delete_auto_scaling_group = _delete_group_response  # type: ignore[method-assign]
    FakeAutoScalingGroup.set_desired_capacity = _wrap_set_desired_capacity(  # type: ignore[method-assign]
        FakeAutoScalingGroup.set_desired_capacity)
    AutoScalingResponse.put_lifecycle_hook = _put_lifecycle_hook  # type: ignore[method-assign]
    AutoScalingResponse.complete_lifecycle_action = _complete_lifecycle_action  # type: ignore[attr-defined]
    AutoScalingResponse.record_lifecycle_action_heartbeat = (  # type: ignore[attr-defined]
        _record_lifecycle_action_heartbeat)
    _hook_model()  # a CloudFormationModel subclass: moto's model list finds it

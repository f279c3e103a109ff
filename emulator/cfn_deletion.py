"""A stack's deletion in CloudFormation's order, and its failure (part of
``emulator.moto_cloudformation``, which installs it).

moto deletes a stack's resources in no particular order, retrying what failed while
anything else goes, and a resource that still fails at the end escapes DeleteStack as an
exception, with the stack dropped from the account. CloudFormation deletes a resource only
after every resource that depends on it (``DependsOn``, ``Ref``, ``Fn::GetAtt``,
``Fn::Sub``: "CloudFormation deletes the resource with the DependsOn attribute first",
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-attribute-dependson.html),
keeps what a failed resource depends on, and leaves the stack ``DELETE_FAILED`` with the
failure's reason in its events
(https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/troubleshooting.html#troubleshooting-errors-delete-stack-fails).
Here :func:`ordered_delete` replaces ``ResourceMap.delete``: dependents first (moto's
retries are kept for moto's own ordering quirks), and :class:`DeletionFailed` names what
failed; :func:`wrap_delete_stack` turns it into the ``DELETE_FAILED`` stack AWS shows.
"""

from __future__ import annotations

import re
from typing import Any

_SUB_NAME = re.compile(r"\$\{([A-Za-z0-9]+)(?:\.[^}]*)?\}")


class DeletionFailed(RuntimeError):
    """Resources the deletion could not delete: ``failures`` (logical id -> reason) and
    the resources kept because something depending on them failed."""

    def __init__(self, failures: dict[str, str], kept: set[str]) -> None:
        self.failures, self.kept = failures, kept
        reasons = "; ".join(f"{k}: {v}" for k, v in sorted(failures.items()))
        super().__init__(f"The following resource(s) failed to delete: "
                         f"[{', '.join(sorted(failures))}]. {reasons}")


def references(value: Any) -> set[str]:
    """Every logical id ``value`` names through Ref, Fn::GetAtt or Fn::Sub."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str):
                found.add(inner)
            elif key == "Fn::GetAtt":
                if isinstance(inner, list) and inner and isinstance(inner[0], str):
                    found.add(inner[0])
                elif isinstance(inner, str):
                    found.add(inner.split(".", 1)[0])
            elif key == "Fn::Sub":
                text = inner[0] if isinstance(inner, list) and inner else inner
                if isinstance(text, str):
                    found.update(_SUB_NAME.findall(text))
                if isinstance(inner, list) and len(inner) > 1:
                    found |= references(inner[1])
            else:
                found |= references(inner)
    elif isinstance(value, list):
        for inner in value:
            found |= references(inner)
    return found


def dependencies(resources: dict[str, Any]) -> dict[str, set[str]]:
    """Logical id -> the template's resources it depends on."""
    out: dict[str, set[str]] = {}
    for name, resource in resources.items():
        resource = resource or {}
        depends = resource.get("DependsOn") or []
        named = {depends} if isinstance(depends, str) else set(depends)
        named |= references({k: v for k, v in resource.items() if k != "DependsOn"})
        out[name] = (named & set(resources)) - {name}
    return out


def ordered_delete(self: Any) -> None:
    """``ResourceMap.delete`` in CloudFormation's order (see the module doc)."""
    resources: dict[str, Any] = self._resource_json_map
    depends = dependencies(resources)
    remaining = {k for k, v in resources.items() if (v or {}).get("DeletionPolicy") != "Retain"}
    failures: dict[str, str] = {}
    progress = True
    while remaining and progress:
        progress = False
        for name in sorted(remaining):
            if name not in remaining or any(name in depends[other] for other in remaining
                                            if other != name):
                continue  # something that depends on it is still there
            parsed = self._parsed_resources.get(name)
            try:
                if not isinstance(parsed, str) and parsed is not None:
                    self._delete_resource(parsed, resources[name])
                    self._parsed_resources.pop(name, None)
            except Exception as exc:  # kept; retried while others go (moto's quirks)
                failures[name] = str(exc) or type(exc).__name__
                continue
            failures.pop(name, None)
            remaining.discard(name)
            progress = True
    if remaining:
        raise DeletionFailed({k: v for k, v in failures.items() if k in remaining},
                             remaining - set(failures))


def wrap_delete_stack(original: Any) -> Any:
    """DeleteStack: a failed deletion leaves the stack ``DELETE_FAILED``, with a
    ``DELETE_FAILED`` event per failed resource and none for the resources kept."""

    def delete_stack(self: Any, name_or_stack_id: str) -> None:
        stack = self.stacks.get(name_or_stack_id)
        try:
            original(self, name_or_stack_id)
        except DeletionFailed as exc:
            if stack is None:
                raise
            self.stacks[stack.stack_id] = stack
            self.deleted_stacks.pop(stack.stack_id, None)
            failed = set(exc.failures) | exc.kept
            stack.events[:] = [e for e in stack.events
                               if getattr(e, "logical_resource_id", "") not in failed
                               or getattr(e, "resource_status", "") != "DELETE_COMPLETE"]
            from moto.cloudformation.models import Event

            resources = stack.template_dict.get("Resources") or {}
            for name, reason in sorted(exc.failures.items()):
                stack.events.append(Event(stack.stack_id, stack.name, name, "",
                                          (resources.get(name) or {}).get("Type", ""),
                                          "DELETE_FAILED", reason, None))
            stack.status = "DELETE_FAILED"
            stack._add_stack_event("DELETE_FAILED", resource_status_reason=str(exc))

    return delete_stack

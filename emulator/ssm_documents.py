"""The account's own shell Command documents, as the emulator's SSM Agent runs them
(``emulator.ssm_agent``): Systems Manager's parameter checks at SendCommand, and the one
``aws:runShellScript`` step with the values in. What AWS does and where it says so is in
``emulator.ssm_agent``'s module doc; this module is pure (no moto state besides the
document lookup).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PLUGIN = "aws:runShellScript"
#: The AWS-RunShellScript default executionTimeout (and a step's without timeoutSeconds).
DEFAULT_EXECUTION_TIMEOUT = 3600


@dataclass
class Plan:
    """What the agent runs for one command: the script's lines, extra environment, the
    execution timeout and the plugin (step) name."""

    lines: list[str]
    env: dict[str, str]
    timeout: float
    plugin: str



def command_document(backend: Any, name: str) -> dict | None:
    """The content of the account's Command document ``name`` if its one step is
    ``aws:runShellScript`` (None: not one the agent plays here); moto's InvalidDocument
    when there is no such document."""
    document = backend._get_documents(name).find(None, None)  # the default version
    content = getattr(document, "content_json", None) or {}
    steps = content.get("mainSteps") or []
    if document.document_type != "Command" or len(steps) != 1 \
            or steps[0].get("action") != PLUGIN:
        return None
    return content


def invalid_parameters(message: str) -> Exception:
    from moto.ssm.exceptions import SSMException

    class InvalidParameters(SSMException):
        def __init__(self) -> None:
            super().__init__("InvalidParameters", message)

    return InvalidParameters()


def resolve_parameters(content: dict, given: dict[str, Any]) -> dict[str, str]:
    """The document's parameter values for ``given`` (SendCommand's Parameters), checked as
    Systems Manager checks them (module doc); InvalidParameters otherwise."""
    declared: dict[str, dict] = content.get("parameters") or {}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise invalid_parameters(f"document does not declare parameters {unknown}")
    values: dict[str, str] = {}
    for name, spec in declared.items():
        raw = given.get(name)
        if raw is None:
            if "default" not in spec:
                raise invalid_parameters(f"parameter {name} is required")
            values[name] = str(spec["default"])
            continue
        items = raw if isinstance(raw, list) else [raw]
        if spec.get("type", "String") == "String" and len(items) != 1:
            raise invalid_parameters(f"parameter {name} is a String: one value, got "
                                      f"{len(items)}")
        for item in items:
            pattern = spec.get("allowedPattern")
            if pattern and re.search(pattern, str(item)) is None:
                raise invalid_parameters(f"parameter {name} value {item!r} does not match "
                                          f"its allowedPattern {pattern}")
            allowed = spec.get("allowedValues")
            if allowed and str(item) not in [str(a) for a in allowed]:
                raise invalid_parameters(f"parameter {name} value {item!r} is not one of "
                                          f"{allowed}")
        values[name] = "\n".join(str(i) for i in items)
    return values


def document_plan(content: dict, values: dict[str, str]) -> Plan:
    """The one ``aws:runShellScript`` step with the values in: ``{{ name }}`` replaced in
    its text, ENV_VAR parameters as ``SSM_<name>``."""
    def substitute(text: str) -> str:
        return re.sub(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}",
                      lambda m: values.get(m.group(1), m.group(0)), text)

    (step,) = content["mainSteps"]
    inputs = step.get("inputs") or {}
    lines = inputs.get("runCommand") or []
    lines = [lines] if isinstance(lines, str) else lines
    env = {f"SSM_{name}": value for name, value in values.items()
           if (content["parameters"][name].get("interpolationType") == "ENV_VAR")}
    timeout = float(substitute(str(inputs.get("timeoutSeconds",
                                              DEFAULT_EXECUTION_TIMEOUT))))
    return Plan([substitute(str(x)) for x in lines], env, timeout, str(step.get("name")))

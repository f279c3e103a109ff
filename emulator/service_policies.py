"""Whether a resource policy lets an AWS service principal act, as the resource's service
decides it, for what the emulator does in a service's name (CloudWatch publishing an alarm
to a topic: ``emulator.alarm_evaluator``); and ``AWS::SNS::TopicPolicy``, which moto's
CloudFormation skips (so a topic kept moto's permissive default policy).

A service principal acts on a resource of the account only where the resource's policy
allows it and nothing denies it
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html);
a topic policy replaces SNS's default one, so a topic whose policy names no CloudWatch
refuses the alarm's publish ("not authorized to perform SNS:Publish",
https://docs.aws.amazon.com/sns/latest/dg/sns-access-policy-use-cases.html), and an
encrypted topic needs the key's policy to let the service use the key
(https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html#compatibility-with-aws-services).

:func:`decide` reads ``Principal`` (``*``, ``{"AWS": "*"}``, ``{"Service": ...}``),
``Action`` / ``NotAction``, ``Resource`` and the condition operators the stack and SNS's
default policy use (``String*``, ``Arn*``, ``Bool``, each with ``IfExists``); a statement
with anything else (``NotPrincipal``, another operator) never allows and always denies, so
the emulator is never kinder than AWS.
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

_STRING = {"StringEquals": (False, False), "StringNotEquals": (False, True),
           "StringLike": (True, False), "StringNotLike": (True, True),
           "ArnEquals": (True, False), "ArnLike": (True, False),
           "ArnNotEquals": (True, True), "ArnNotLike": (True, True)}


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _principal_matches(principal: Any, service: str) -> bool:
    if principal == "*":
        return True
    if not isinstance(principal, dict):
        return False
    if "*" in _as_list(principal.get("AWS", [])):
        return True
    return service in _as_list(principal.get("Service", []))


def _any_like(patterns: Any, value: str, *, like: bool = True) -> bool:
    return any(fnmatch.fnmatchcase(value.lower(), str(p).lower()) if like
               else value.lower() == str(p).lower() for p in _as_list(patterns))


def _condition_holds(conditions: dict, context: dict[str, str]) -> bool | None:
    """True / False; None for an operator this module does not know."""
    keys = {k.lower(): v for k, v in context.items()}
    for operator, tests in conditions.items():
        base = operator.removesuffix("IfExists")
        if_exists = operator.endswith("IfExists")
        if base != "Bool" and base not in _STRING:
            return None
        for key, wanted in (tests or {}).items():
            value = keys.get(key.lower())
            if value is None:
                if if_exists:
                    continue
                return False
            if base == "Bool":
                if str(value).lower() not in [str(w).lower() for w in _as_list(wanted)]:
                    return False
            elif base in _STRING:
                like, negated = _STRING[base]
                if base.startswith("String") and not like:
                    matched = any(value == str(w) for w in _as_list(wanted))
                else:
                    matched = _any_like(wanted, value)
                if matched == negated:
                    return False
    return True


def decide(policy: str | dict, *, service: str, action: str, resource: str,
           context: dict[str, str]) -> str:
    """"" when the policy lets ``service`` do ``action`` on ``resource`` with the request
    ``context`` (condition keys); else why not."""
    document = json.loads(policy) if isinstance(policy, str) else policy
    allowed = False
    for statement in _as_list((document or {}).get("Statement", [])):
        effect = statement.get("Effect")
        known = "NotPrincipal" not in statement
        if known and not _principal_matches(statement.get("Principal"), service):
            continue
        if "NotAction" in statement:
            if _any_like(statement["NotAction"], action):
                continue
        elif not _any_like(statement.get("Action", []), action):
            continue
        if not _any_like(statement.get("Resource", "*"), resource):
            continue
        holds = _condition_holds(statement.get("Condition") or {}, context)
        if effect == "Deny" and (holds is not False or not known):
            return f"explicitly denied by statement {statement.get('Sid', '(no Sid)')}"
        if effect == "Allow" and known and holds is True:
            allowed = True
    return "" if allowed else f"no statement allows {service} to perform {action}"


def _topic_policy_model() -> type:
    """``AWS::SNS::TopicPolicy``: the document becomes each topic's policy; deleting it
    puts SNS's default back, as CloudFormation does."""
    from moto.sns.models import sns_backends

    from emulator.cfn_model import cfn_model

    def topics(p: dict[str, Any], account: str, region: str) -> list[Any]:
        backend = sns_backends[account][region]
        return [backend.get_topic(arn) for arn in p.get("Topics") or []
                if isinstance(arn, str) and arn in backend.topics]

    def create(name: str, p: dict[str, Any], account: str, region: str) -> str:
        for topic in topics(p, account, region):
            topic.policy = json.dumps(p.get("PolicyDocument") or {})
        return name

    def delete(name: str, p: dict[str, Any], account: str, region: str) -> None:
        for topic in topics(p, account, region):
            topic.policy = json.dumps(topic._create_default_topic_policy(
                region, account, topic.name))

    return cfn_model("AWS::SNS::TopicPolicy", create=create, delete=delete)


_INSTALLED: list[bool] = []


def install() -> None:
    """Register ``AWS::SNS::TopicPolicy`` with moto's CloudFormation (once)."""
    if not _INSTALLED:
        _topic_policy_model()
        _INSTALLED.append(True)

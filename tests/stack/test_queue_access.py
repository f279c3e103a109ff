"""Only the master speaks for itself on the master queue: its role alone may receive and
delete there; the workers' role has no action on it at all (workers learn the membership
from EFS and never send: nothing in bootstrap_scripts/ calls SQS on a worker).

moto's IAM enforcement (``INITIAL_NO_AUTH_ACTION_COUNT``) is not used here: it evaluates an
SQS call against the resource ``*`` only, so a grant scoped to the queue's ARN (the one the
master needs) would be refused too and the check could not tell the two roles apart."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from tests.stack.synth import cluster_template

CONSUME = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"}


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template()


def actions_on(t: Template, policy_fragment: str, resource: dict) -> set[str]:
    found = [p for k, p in t.find_resources("AWS::IAM::Policy").items() if policy_fragment in k]
    assert len(found) == 1, policy_fragment
    out: set[str] = set()
    for st in found[0]["Properties"]["PolicyDocument"]["Statement"]:
        res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        if resource in res or "*" in res:
            acts = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            out |= {a for a in acts if a.startswith("sqs:")}
    return out


def master_queue_arn(t: Template) -> dict:
    (queue,) = [k for k in t.find_resources("AWS::SQS::Queue") if "MetadataQueuesMaster" in k
                and "DeadLetters" not in k]
    return {"Fn::GetAtt": [queue, "Arn"]}


def test_only_the_master_consumes_the_master_queue(template: Template) -> None:
    arn = master_queue_arn(template)
    assert actions_on(template, "MasterGroupInstanceRoleDefaultPolicy", arn) >= CONSUME
    assert actions_on(template, "WorkerGroupInstanceRoleDefaultPolicy", arn) == set()

"""Only the master speaks for itself on the master queue: its role alone may receive and
delete there; the workers' role has no action on it at all (workers learn the membership
from EFS and never send to it; their only SQS calls are sends on the warm-ready and
node-keys queues).

This is the template's side. The calls themselves are refused with moto's IAM authorization
switched on (``emulator/iam_enforcement.py``, which evaluates the queue a ``QueueUrl``
names): the chaos drill ``tests/chaos/test_iam_drill.py`` shows a worker's role refused
ReceiveMessage on the master queue of a deployed emulated cluster."""

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

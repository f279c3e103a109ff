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
from tests.support.iam_statements import CONSUME, actions_on


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template()




def master_queue_arn(t: Template) -> dict:
    (queue,) = [k for k in t.find_resources("AWS::SQS::Queue") if "MetadataQueuesMaster" in k
                and "DeadLetters" not in k]
    return {"Fn::GetAtt": [queue, "Arn"]}


def test_only_the_master_consumes_the_master_queue(template: Template) -> None:
    arn = master_queue_arn(template)
    assert actions_on(template, "MasterGroupInstanceRoleDefaultPolicy", arn) >= CONSUME
    assert actions_on(template, "WorkerGroupInstanceRoleDefaultPolicy", arn) == set()

"""The node-keys queue (constructs_lib/node_keys.py): a worker can only send its key there,
and only the master reads it; every node boots with its URL, the master with the workers'
role ID whose sessions it believes (docs/security.md, "a worker cannot speak for another
node")."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template

from tests.stack.synth import cluster_template
from tests.support.iam_statements import CONSUME, actions_on


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template()


def node_keys_queue(t: Template) -> tuple[str, dict]:
    (name,) = [k for k in t.find_resources("AWS::SQS::Queue") if "NodeKeysQueue" in k]
    return name, t.find_resources("AWS::SQS::Queue")[name]


def test_workers_only_send_and_the_master_only_consumes_the_node_keys_queue(template):
    name, queue = node_keys_queue(template)
    arn = {"Fn::GetAtt": [name, "Arn"]}
    assert actions_on(template, "WorkerGroupInstanceRoleDefaultPolicy", arn) == {
        "sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"}
    master = actions_on(template, "MasterGroupInstanceRoleDefaultPolicy", arn)
    assert master >= CONSUME and "sqs:SendMessage" not in master
    assert queue["Properties"]["SqsManagedSseEnabled"] is True


def test_every_node_boots_with_the_queue_and_the_master_with_whose_keys_it_learns(template):
    name, _queue = node_keys_queue(template)
    for group, role_id in (("MasterGroup", True), ("WorkerGroup", False)):
        (lt,) = [v for k, v in template.find_resources("AWS::EC2::LaunchTemplate").items()
                 if group in k]
        user_data = json.dumps(lt["Properties"]["LaunchTemplateData"]["UserData"])
        assert "node-keys-queue-url" in user_data and name in user_data, group
        assert ("worker-role-id" in user_data) is role_id, group

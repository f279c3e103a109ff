"""A notification the capacity adjuster cannot process is not lost silently.

SNS invokes the function asynchronously. After Lambda's retries, the invocation record goes
to the function's on-failure destination, the master queue's dead-letter queue
(``constructs_lib.CapacityAdjuster``); the master agent, still waiting for the groups' setup,
finds it there and fails the wait condition naming the notification.

What moto cannot do, these tests do in Lambda's place, as AWS documents it
(https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html and
https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-retain-records.html): call the
real handler once plus two retries, then send the documented invocation record
(``requestContext.condition`` ``RetriesExhausted``, the SNS event as ``requestPayload``, the
error as ``responsePayload``) to the destination queue.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import pytest
from adjuster_harness import (
    CLUSTER_TAG_KEY,
    LAUNCH,
    ROLE_TAG_KEY,
    fixture_record,
    import_adjuster,
    sns_event,
)

from bootstrap_scripts.agent.lost_notifications import LostNotifications, describe
from bootstrap_scripts.agent.node_agent import EXIT_FAILED
from emulator.resources import ClusterResources, create_cluster
from emulator.wait_handle import WaitHandle
from tests.support.agents import AgentThread, config, master_identity

#: Lambda's default retries of an asynchronous invocation (the construct's RETRY_ATTEMPTS).
RETRIES = 2


def dead_letter_queue(cluster: ClusterResources) -> str:
    sqs = cluster.client("sqs")
    policy = sqs.get_queue_attributes(QueueUrl=cluster.master_queue_url,
                                      AttributeNames=["RedrivePolicy"])["Attributes"]
    name = json.loads(policy["RedrivePolicy"])["deadLetterTargetArn"].rsplit(":", 1)[1]
    return sqs.get_queue_url(QueueName=name)["QueueUrl"]


def invoke_async_until_dropped(event: dict[str, Any], destination: str,
                               cluster: ClusterResources) -> Exception:
    """Lambda's part: the first attempt and RETRIES retries of the real handler, each
    raising; then the on-failure invocation record to ``destination``."""
    handler = import_adjuster().handler
    errors = []
    for _attempt in range(1 + RETRIES):
        with pytest.raises(Exception) as err:  # any function error: Lambda retries it
            handler(event, None)
        errors.append(err.value)
    last = errors[-1]
    record = {
        "version": "1.0",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "functionArn": "arn:aws:lambda:us-east-1:123456789012:function:adjuster:$LATEST",
            "condition": "RetriesExhausted",
            "approximateInvokeCount": 1 + RETRIES,
        },
        "requestPayload": event,
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST",
                            "functionError": "Unhandled"},
        "responsePayload": {"errorMessage": str(last), "errorType": type(last).__name__},
    }
    cluster.client("sqs").send_message(QueueUrl=destination, MessageBody=json.dumps(record))
    return last


@pytest.fixture()
def cloud(moto_reset: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    return moto_reset


def test_dropped_launch_notification_fails_the_wait_condition_naming_it(
        cloud: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = create_cluster(cloud, workers=1)
    cluster.send(cluster.setup_message("master"))
    ((worker, _address),) = cluster.instances("worker")
    # The function cannot reach its queue (say, a policy change): every attempt fails.
    for key, value in {"MASTER_QUEUE_URL": cluster.master_queue_url + "-gone",
                       "CLUSTER_ID": cluster.cluster_id, "CLUSTER_TAG_KEY": CLUSTER_TAG_KEY,
                       "ROLE_TAG_KEY": ROLE_TAG_KEY, "LOG_LEVEL": "ERROR"}.items():
        monkeypatch.setenv(key, value)
    dlq = dead_letter_queue(cluster)
    error = invoke_async_until_dropped(
        sns_event(fixture_record(LAUNCH, cluster.worker_asg, worker)), dlq, cluster)

    recorder = WaitHandle()
    agent = AgentThread(config(cluster, "master", tmp_path, "m", recorder.url),
                        master_identity(cluster))
    try:
        (sig,) = recorder.wait_for(1, timeout=60)
        agent.thread.join(timeout=30)
    finally:
        agent.stop()
        recorder.stop()
    assert sig["Status"] == "FAILURE"
    reason = sig["Reason"]
    assert (f"the capacity adjuster dropped autoscaling:EC2_INSTANCE_LAUNCH of group "
            f"{cluster.worker_asg} (instance {worker})") in reason
    assert "RetriesExhausted after 3 attempt(s)" in reason
    assert type(error).__name__ in reason
    assert agent.exit_code == EXIT_FAILED
    # Only looked at: the record stays for whoever investigates.
    attrs = cluster.client("sqs").get_queue_attributes(
        QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "1"


def test_only_records_sent_since_the_setup_started_count(cloud: str) -> None:
    cluster = create_cluster(cloud, workers=1)
    cluster.client("sqs").send_message(QueueUrl=dead_letter_queue(cluster),
                                       MessageBody='{"kind": "asg-setup"}')
    lost = LostNotifications(cluster.master_queue_url, logging.getLogger("test"))
    sqs = cluster.client("sqs")
    assert lost.since(sqs, time.time() + 3600) == []
    (found,) = lost.since(sqs, 0.0)
    assert found.what.startswith("a master-queue message was never processed")
    (again,) = lost.since(sqs, 0.0)  # still there: looking does not consume
    assert again == found


def test_a_master_queue_without_dead_letter_queue_has_nothing_to_look_at(cloud: str) -> None:
    import boto3

    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="plain")["QueueUrl"]
    lost = LostNotifications(url, logging.getLogger("test"))
    assert lost.since(sqs, 0.0) == [] and lost.no_queue


def test_describe_names_event_group_and_error_or_quotes_the_body() -> None:
    record = {"requestContext": {"condition": "EventAgeExceeded", "approximateInvokeCount": 1},
              "requestPayload": sns_event(fixture_record(LAUNCH, "grp", "i-0abc")),
              "responsePayload": None}
    assert describe(json.dumps(record)) == (
        "the capacity adjuster dropped autoscaling:EC2_INSTANCE_LAUNCH of group grp "
        "(instance i-0abc) (EventAgeExceeded after 1 attempt(s))")
    assert describe("not json") == "a master-queue message was never processed: 'not json'"


def test_a_lost_notification_fails_only_a_master_still_waiting() -> None:
    from bootstrap_scripts.agent.master import TRANSITIONS, Event, Master, Phase

    assert Master.decide(Phase.WAITING_FOR_GROUPS, Event.NOTIFICATION_LOST) is Phase.FAILED
    assert [p for (p, e) in TRANSITIONS if e is Event.NOTIFICATION_LOST] == [
        Phase.WAITING_FOR_GROUPS]


def test_the_emulator_deploys_the_event_invoke_config(cloud: str) -> None:
    """moto's CloudFormation skips AWS::Lambda::EventInvokeConfig; the emulator
    (emulator/moto_extensions.py) creates it, so the deployed function answers with its
    destination as on AWS."""
    import boto3

    cfn = boto3.client("cloudformation", region_name="us-east-1")
    template = {"Resources": {
        "Dlq": {"Type": "AWS::SQS::Queue"},
        "Role": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                           "Principal": {"Service": "lambda.amazonaws.com"}}]}}},
        "Fn": {"Type": "AWS::Lambda::Function", "Properties": {
            "Runtime": "python3.12", "Handler": "index.handler",
            "Role": {"Fn::GetAtt": ["Role", "Arn"]},
            "Code": {"ZipFile": "def handler(event, context):\n    return None\n"}}},
        "Config": {"Type": "AWS::Lambda::EventInvokeConfig", "Properties": {
            "FunctionName": {"Ref": "Fn"}, "Qualifier": "$LATEST", "MaximumRetryAttempts": 2,
            "MaximumEventAgeInSeconds": 1800,
            "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": ["Dlq", "Arn"]}}}}},
    }}
    cfn.create_stack(StackName="EventInvoke", TemplateBody=json.dumps(template))
    resources = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in
                 cfn.describe_stack_resources(StackName="EventInvoke")["StackResources"]}
    config = boto3.client("lambda", region_name="us-east-1").get_function_event_invoke_config(
        FunctionName=resources["Fn"])
    assert config["MaximumRetryAttempts"] == 2 and config["MaximumEventAgeInSeconds"] == 1800
    dlq_name = resources["Dlq"].rsplit("/", 1)[1]
    assert config["DestinationConfig"]["OnFailure"]["Destination"].endswith(":" + dlq_name)
    assert "Config" in resources

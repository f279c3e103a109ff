"""The stack's own alarms fire on the metrics the product emits (emulator/alarm_evaluator.py).

The alarms come from the synthesized DLClusterStack template (deployed on moto's
CloudFormation through ``emulator.moto_alarms``); the data points come from the product's
own EMF lines (the controller's cluster line, the executor's GPU sample) through the
emulator's EMF extraction, from Auto Scaling's group metrics as the emulator publishes
them, and, for the EFS I/O alarm, ``MeteredIOBytes`` put as EFS publishes it (the emulated
file system is a local directory that meters nothing). So a name, a dimension, a statistic
or a threshold of an alarm that does not match what the nodes write fails here: on AWS that
alarm would never fire. Each alarm is shown firing (ALARM, CloudWatch's notification on the
alarm topic, read from an SQS subscriber) and a healthy cluster is shown raising none."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from bootstrap_scripts.jobs.controller import metrics as controller_metrics
from bootstrap_scripts.jobs.controller.engine_facts import Facts
from bootstrap_scripts.jobs.executor.gpu_sampler import sample_line
from bootstrap_scripts.metrics import gpu_metrics
from emulator import alarm_evaluator, emf_extract, moto_cloudformation
from tests.stack.synth import cluster_template

REGION = "us-east-1"
CLUSTER = "DLClusterStack"
GROUPS = {"master": "dl-master-asg", "worker": "dl-worker-asg"}
FILE_SYSTEM = "fs-0123456789abcdef0"
NOW = datetime.now(UTC).replace(second=30, microsecond=0)


def _resolve(value, refs: dict[str, object]):
    if isinstance(value, dict):
        if set(value) == {"Ref"} and value["Ref"] in refs:
            return refs[value["Ref"]]
        return {k: _resolve(v, refs) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, refs) for v in value]
    return value


@pytest.fixture(scope="module")
def alarms_template() -> dict:
    """The stack's alarms, their topic a topic of this template, their groups named."""
    resources = cluster_template().to_json()["Resources"]
    topic = next(k for k, v in resources.items()
                 if v["Type"] == "AWS::SNS::Topic" and "AlarmTopic" in k)
    refs: dict[str, object] = {
        k: GROUPS["master" if "Master" in k else "worker"] for k, v in resources.items()
        if v["Type"] == "AWS::AutoScaling::AutoScalingGroup"}
    refs |= {k: FILE_SYSTEM for k, v in resources.items() if v["Type"] == "AWS::EFS::FileSystem"}
    alarms = {k: {"Type": v["Type"], "Properties": _resolve(v["Properties"], refs)}
              for k, v in resources.items() if v["Type"] == "AWS::CloudWatch::Alarm"}
    assert len(alarms) >= 5
    # the topic's policy as the stack writes it: CloudWatch publishes only if it allows it
    (policy_id,) = [k for k, v in resources.items() if v["Type"] == "AWS::SNS::TopicPolicy"
                    and v["Properties"]["Topics"] == [{"Ref": topic}]]
    policy = {"Type": "AWS::SNS::TopicPolicy", "Properties": resources[policy_id]["Properties"]}
    return {"Resources": {topic: {"Type": "AWS::SNS::Topic", "Properties": {}},
                          "TopicPolicy": policy, **alarms}}


def _without_cloudwatch(template: dict) -> dict:
    """The template with the alarm topic's policy as it was before it named CloudWatch."""
    out = json.loads(json.dumps(template))
    document = out["Resources"]["TopicPolicy"]["Properties"]["PolicyDocument"]
    document["Statement"] = [s for s in document["Statement"] if "cloudwatch" not in
                             json.dumps(s.get("Principal", ""))]
    return out


@pytest.fixture()
def cloud(alarms_template, request):
    moto_cloudformation.install()
    template = getattr(request, "param", alarms_template)
    if template == "without-cloudwatch":
        template = _without_cloudwatch(alarms_template)
    with mock_aws():
        session = boto3.session.Session(region_name=REGION)
        session.client("cloudformation").create_stack(
            StackName=CLUSTER, TemplateBody=json.dumps(template))
        sns, sqs = session.client("sns"), session.client("sqs")
        (topic,) = [t["TopicArn"] for t in sns.list_topics()["Topics"]]
        queue = sqs.create_queue(QueueName="alarm-mail")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn["Attributes"]["QueueArn"])
        yield session, queue


def _ms(minutes_ago: float) -> int:
    return int((NOW - timedelta(minutes=minutes_ago)).timestamp() * 1000)


def _controller(session, minutes_ago: float, *, running: int = 1, new: int = 0,
                unhealthy: int = 0) -> None:
    line = controller_metrics.cluster_line(
        cluster=CLUSTER, job_id="train-1" if running else "", running=running, new=new,
        unhealthy=unhealthy, facts=Facts(nodes=3, generation=2), timestamp_ms=_ms(minutes_ago))
    assert emf_extract.publish(session.client("cloudwatch"), [line])


def _gpus(session, minutes_ago: float, *, utilization: float, xids: int = 0) -> None:
    readings = [gpu_metrics.GpuReading(i, utilization, 1000.0, 50.0, 100.0, 0.0, False)
                for i in range(2)]
    line = sample_line(readings, CLUSTER, "i-0123456789abcdef0", _ms(minutes_ago), xids=xids)
    assert line and emf_extract.publish(session.client("cloudwatch"), [line])


def _groups(session, minutes_ago: float, *, desired: int, in_service: int) -> None:
    for name in GROUPS.values():
        group = {"AutoScalingGroupName": name, "MinSize": 0, "MaxSize": 8,
                 "DesiredCapacity": desired,
                 "Instances": [{"LifecycleState": "InService"}] * in_service,
                 "EnabledMetrics": [{"Metric": m} for m in alarm_evaluator.GROUP_METRICS]}
        session.client("cloudwatch").put_metric_data(
            Namespace="AWS/AutoScaling", MetricData=alarm_evaluator.group_metric_data(
                group, NOW - timedelta(minutes=minutes_ago)))


def _efs_io(session, minutes_ago: float, gib: float) -> None:
    """What EFS itself publishes for the file system (no node writes it): metered bytes."""
    session.client("cloudwatch").put_metric_data(Namespace="AWS/EFS", MetricData=[{
        "MetricName": "MeteredIOBytes", "Unit": "Bytes", "Value": gib * 1024 ** 3,
        "Timestamp": NOW - timedelta(minutes=minutes_ago),
        "Dimensions": [{"Name": "FileSystemId", "Value": FILE_SYSTEM}]}])


def _healthy(session, minutes: int = 20, *, but: str = "") -> None:
    """Twenty busy, healthy minutes; ``but``: the source the fault writes instead."""
    for m in range(minutes):
        _controller(session, m)
        if but != "gpus":
            _gpus(session, m, utilization=85.0)
        if but != "groups":
            _groups(session, m, desired=2, in_service=2)
        _efs_io(session, m, 0.5)  # a busy hour's checkpoints: 10 GiB in twenty minutes


def _evaluate(session, *, refused: bool = False) -> tuple[dict[str, str], list[dict]]:
    acts = alarm_evaluator.CloudWatchActs(session)
    acts.tick(NOW)
    assert not acts.problems
    assert bool(acts.refused) == refused, acts.refused
    states = {a["AlarmName"]: a["StateValue"]
              for a in session.client("cloudwatch").describe_alarms()["MetricAlarms"]}
    sqs = session.client("sqs")
    mail = []
    while True:
        got = sqs.receive_message(QueueUrl=_evaluate.queue, MaxNumberOfMessages=10)
        if not got.get("Messages"):
            return states, mail
        mail += [json.loads(json.loads(m["Body"])["Message"]) for m in got["Messages"]]


def _alarming(states: dict[str, str]) -> set[str]:
    return {next(part for part in ("NodeUnhealthy", "JobRestartingRepeatedly", "GpuXidErrors",
                                   "GpusIdleWhileJobRuns", "NodesMissing", "EfsIoHigh")
                 if part in name)
            for name, state in states.items() if state == "ALARM"}


def test_a_healthy_busy_cluster_raises_no_alarm(cloud) -> None:
    session, _evaluate.queue = cloud
    _healthy(session)
    states, mail = _evaluate(session)
    assert set(states.values()) == {"OK"}, states
    assert mail == []


@pytest.mark.parametrize(("fault", "but", "alarm"), [
    (lambda s: [_controller(s, m, unhealthy=1) for m in (0, 1)], "", "NodeUnhealthy"),
    # a one-hour period is a clock hour (CloudWatch aligns periods): three within this one
    (lambda s: [_controller(s, m, new=1) for m in (0, 0.1, 0.2)], "",
     "JobRestartingRepeatedly"),
    (lambda s: _gpus(s, 0, utilization=85.0, xids=1), "", "GpuXidErrors"),
    (lambda s: [_gpus(s, m, utilization=1.0 if m < 15 else 85.0) for m in range(20)], "gpus",
     "GpusIdleWhileJobRuns"),
    (lambda s: [_groups(s, m, desired=3, in_service=2) for m in range(20)], "groups",
     "NodesMissing"),
    # EFS's own metric (no node writes it), within one minute: 50 GiB, the default threshold
    (lambda s: [_efs_io(s, m, 25.0) for m in (0, 0.1)], "", "EfsIoHigh"),
])
def test_each_alarm_fires_on_what_the_nodes_emit_and_mails_the_topic(cloud, fault, but,
                                                                     alarm) -> None:
    session, _evaluate.queue = cloud
    _healthy(session, but=but)
    fault(session)
    states, mail = _evaluate(session)
    assert _alarming(states) == {alarm}, states
    assert mail and {m["NewStateValue"] for m in mail} == {"ALARM"}
    assert all(alarm in m["AlarmName"] and "Threshold Crossed" in m["NewStateReason"]
               for m in mail)


def test_one_unhealthy_minute_is_not_enough_for_the_node_alarm(cloud) -> None:
    session, _evaluate.queue = cloud
    _healthy(session)
    _controller(session, 0, unhealthy=1)  # the alarm wants two periods in a row
    for m in (0.1, 0.2):
        _controller(session, m, new=1)  # two restarts: the restart alarm wants three
    states, _ = _evaluate(session)
    assert _alarming(states) == set(), states


@pytest.mark.parametrize("cloud", ["without-cloudwatch"], indirect=True)
def test_a_topic_policy_without_cloudwatch_refuses_the_alarms_mail(cloud) -> None:
    """A topic policy replaces SNS's default one: without a statement for CloudWatch the
    alarm still changes state, but SNS refuses its publish and no mail is sent."""
    session, _evaluate.queue = cloud
    _healthy(session)
    _controller(session, 0, unhealthy=1)
    _controller(session, 1, unhealthy=1)
    states, mail = _evaluate(session, refused=True)
    assert _alarming(states) == {"NodeUnhealthy"}, states
    assert mail == []

"""The cluster's logs, dashboard and alarms (constructs_lib/observability.py): the log group
is KMS-encrypted with the settings' retention, the nodes may write to it and nothing else,
the dashboard and the alarms exist and alarm to the encrypted topic, the user data hands
the installer the log group."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template

from bootstrap_scripts.metrics import metric_names as names
from constructs_lib.observability import check_retention, dashboard_name
from constructs_lib.validation import ConfigError
from tests.stack.synth import cluster_template


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template(logRetentionDays="90", alarmEmail="ops@example.com")


def resources(t: Template, kind: str) -> dict[str, dict]:
    return t.find_resources(kind)


def test_one_log_group_per_cluster_encrypted_with_the_retention_setting(template) -> None:
    (group,) = [g for g in resources(template, "AWS::Logs::LogGroup").values()
                if g["Properties"].get("LogGroupName") == names.log_group_name("DLClusterStack")]
    props = group["Properties"]
    assert props["RetentionInDays"] == 90
    key_id = props["KmsKeyId"]["Fn::GetAtt"][0]
    key = template.to_json()["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    logs_statements = [s for s in key["KeyPolicy"]["Statement"]
                       if "logs." in json.dumps(s.get("Principal", {}))]
    assert logs_statements and all("Condition" in s for s in logs_statements)


def test_default_retention_is_30_days() -> None:
    t = cluster_template()
    (group,) = [g for g in resources(t, "AWS::Logs::LogGroup").values()
                if g["Properties"].get("LogGroupName") == names.log_group_name("DLClusterStack")]
    assert group["Properties"]["RetentionInDays"] == 30


def test_node_roles_may_only_create_streams_and_put_events_in_the_cluster_group(
        template) -> None:
    tpl = template.to_json()["Resources"]
    (group_id,) = [k for k, v in tpl.items() if v["Type"] == "AWS::Logs::LogGroup"
                   and v["Properties"].get("LogGroupName") == "/deeplearning/DLClusterStack"]
    found = []
    for policy in resources(template, "AWS::IAM::Policy").values():
        for st in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            logs_actions = [a for a in actions if a.startswith("logs:")]
            if not logs_actions or group_id not in json.dumps(st["Resource"]):
                continue
            assert sorted(logs_actions) == ["logs:CreateLogStream", "logs:PutLogEvents"]
            assert st["Resource"] == {"Fn::GetAtt": [group_id, "Arn"]}
            found.append(policy["Properties"]["Roles"])
    roles = json.dumps(found)
    assert "MasterGroup" in roles and "WorkerGroup" in roles


def test_no_other_policy_grants_logs_on_every_resource(template) -> None:
    for policy in resources(template, "AWS::IAM::Policy").values():
        for st in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            if any(a in ("logs:PutLogEvents", "logs:*") for a in actions):
                assert st["Resource"] != "*"


def test_dashboard_shows_groups_gpus_jobs_and_restarts(template) -> None:
    (board,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    assert board["Properties"]["DashboardName"] == dashboard_name("DLClusterStack")
    body = json.dumps(board["Properties"]["DashboardBody"])
    for metric in ("GroupInServiceInstances", "GroupDesiredCapacity",
                   names.METRIC_GPU_UTILIZATION, names.METRIC_JOBS_RUNNING,
                   names.METRIC_JOB_RESTARTS, names.METRIC_UNHEALTHY_NODES):
        assert metric in body, metric
    assert names.NAMESPACE in body and names.DIM_INSTANCE in body


def test_alarms_exist_and_notify_the_encrypted_topic(template) -> None:
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    ids = " ".join(alarms)
    for name in ("NodeUnhealthy", "JobRestartingRepeatedly", "GpusIdleWhileJobRuns",
                 "GpuXidErrors", "NodesMissing"):
        assert name in ids, name
    tpl = template.to_json()["Resources"]
    (topic_id,) = [k for k, v in tpl.items() if v["Type"] == "AWS::SNS::Topic"
                   and "AlarmTopic" in k]
    assert "KmsMasterKeyId" in tpl[topic_id]["Properties"]
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}]
    (sub,) = [v for v in resources(template, "AWS::SNS::Subscription").values()
              if v["Properties"]["Protocol"] == "email"]
    assert sub["Properties"]["TopicArn"] == {"Ref": topic_id}
    assert sub["Properties"]["Endpoint"] == "ops@example.com"


def test_user_data_hands_the_installer_the_log_group(template) -> None:
    body = json.dumps(resources(template, "AWS::EC2::LaunchTemplate"))
    assert "--log-group '/deeplearning/DLClusterStack'" in body
    assert "amazon-cloudwatch-agent" in body


@pytest.mark.parametrize("days", [0, 31, True, "30"])
def test_a_retention_cloudwatch_refuses_is_refused(days) -> None:
    with pytest.raises(ConfigError, match="log_retention_days"):
        check_retention("ClusterObservability Observability", days)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(Exception, match="logRetentionDays"):
        cluster_template(logRetentionDays="31")
    with pytest.raises(Exception, match="alarmEmail"):
        cluster_template(alarmEmail="not an address")

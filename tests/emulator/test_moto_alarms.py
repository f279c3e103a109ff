"""The emulator's ``AWS::CloudWatch::Alarm`` (emulator/moto_alarms.py): a template whose
dashboard shows its alarms (as the observability construct's does) deploys on moto's
CloudFormation, the alarms are listed as on AWS, math alarms with their queries, and they
go with the stack. (The construct's own template: tests/stack/test_observability.py.)"""

from __future__ import annotations

import json

import boto3
from moto import mock_aws

from emulator import moto_cloudformation

METRIC = {"Namespace": "DeepLearningCluster", "MetricName": "JobsRunning",
          "Dimensions": [{"Name": "ClusterId", "Value": "S"}]}
TEMPLATE = {"Resources": {
    "Plain": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
        **METRIC, "Statistic": "Maximum", "Period": 60, "EvaluationPeriods": 2,
        "Threshold": 1, "ComparisonOperator": "GreaterThanOrEqualToThreshold"}},
    "Math": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
        "EvaluationPeriods": 15, "Threshold": 1,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "Metrics": [{"Id": "expr", "Expression": "IF(jobs > 0, 1, 0)", "ReturnData": True},
                    {"Id": "jobs", "ReturnData": False, "MetricStat": {
                        "Metric": METRIC, "Period": 60, "Stat": "Maximum"}}]}},
    "Board": {"Type": "AWS::CloudWatch::Dashboard", "Properties": {
        "DashboardName": "S-cluster", "DashboardBody": {"Fn::Join": ["", [
            '{"widgets":[{"type":"alarm","properties":{"alarms":["',
            {"Fn::GetAtt": ["Math", "Arn"]}, '"]}}]}']]}}},
}}


def test_alarms_deploy_are_listed_and_go_with_the_stack() -> None:
    moto_cloudformation.install()
    with mock_aws():
        cfn = boto3.client("cloudformation", region_name="us-east-1")
        cw = boto3.client("cloudwatch", region_name="us-east-1")
        cfn.create_stack(StackName="S", TemplateBody=json.dumps(TEMPLATE))
        assert cfn.describe_stacks(StackName="S")["Stacks"][0]["StackStatus"] == \
            "CREATE_COMPLETE"
        alarms = {a["AlarmName"]: a for a in cw.describe_alarms()["MetricAlarms"]}
        (math,) = [a for n, a in alarms.items() if "Math" in n]
        (plain,) = [a for n, a in alarms.items() if "Plain" in n]
        assert {q["Id"] for q in math["Metrics"]} == {"expr", "jobs"}
        assert {math["StateValue"], plain["StateValue"]} == {"INSUFFICIENT_DATA"}  # as AWS
        assert [q["ReturnData"] for q in math["Metrics"]] == [True, False]
        assert plain["MetricName"] == "JobsRunning" and plain["Dimensions"] == [
            {"Name": "ClusterId", "Value": "S"}]
        body = cw.get_dashboard(DashboardName="S-cluster")["DashboardBody"]
        assert math["AlarmArn"] in body
        cfn.delete_stack(StackName="S")
        assert cw.describe_alarms()["MetricAlarms"] == []

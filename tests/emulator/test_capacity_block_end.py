"""A Capacity Block's end deployed through moto's CloudFormation over HTTP: the stack's
``Custom::CapacityBlockEnd`` (the capacity adjuster's function, answered by the emulator with
the project's request code) reads a bought block's end, and the two EventBridge Scheduler
schedules fed from its attributes exist with their ``at()`` times; a block id the account
does not have fails the deploy as EC2's refusal fails it on AWS. The schedules never fire in
the emulator (docs/emulator.md): their invocation is tested in
``tests/lambda/test_capacity_block.py``."""

from __future__ import annotations

import datetime as dt
import json

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator import capacity_blocks
from tests.conftest import REGION
from tests.support.quotas import operator_quotas

ACCOUNT = "123456789012"


def _group() -> dict:
    return {"Type": "AWS::AutoScaling::AutoScalingGroup", "DependsOn": ["BlockEnd"],
            "Properties": {"AvailabilityZones": [f"{REGION}a"],
                           "LaunchConfigurationName": {"Ref": "Config"},
                           "MinSize": "1", "MaxSize": "1", "DesiredCapacity": "1"}}


def _schedule(attribute: str, group: str) -> dict:
    """As ``constructs_lib/capacity_block_end.py`` synthesizes it."""
    return {"Type": "AWS::Scheduler::Schedule", "Properties": {
        "FlexibleTimeWindow": {"Mode": "OFF"}, "ScheduleExpressionTimezone": "UTC",
        "ScheduleExpression": {"Fn::Join": ["", [
            "at(", {"Fn::GetAtt": ["BlockEnd", attribute]}, ")"]]},
        "Target": {"Arn": {"Fn::GetAtt": ["Adjuster", "Arn"]},
                   "RoleArn": {"Fn::GetAtt": ["ScheduleRole", "Arn"]},
                   "Input": {"Fn::Join": ["", [
                       '{"CapacityBlockEnd":{"Group":"', {"Ref": group}, '"}}']]}}}}


def template(block_id: str) -> dict:
    role = {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "x.amazonaws.com"}}]}}}
    return {"Resources": {
        "Role": role, "ScheduleRole": role,
        "Adjuster": {"Type": "AWS::Lambda::Function", "Properties": {
            "Handler": "capacity_adjuster.handler", "Runtime": "python3.12",
            "Role": {"Fn::GetAtt": ["Role", "Arn"]},
            "Code": {"ZipFile": "def handler(event, context):\n    pass\n"}}},
        "BlockEnd": {"Type": "Custom::CapacityBlockEnd", "Properties": {
            "ServiceToken": {"Fn::GetAtt": ["Adjuster", "Arn"]},
            "CapacityBlockId": block_id, "LeadMinutes": "60"}},
        "Config": {"Type": "AWS::AutoScaling::LaunchConfiguration",
                   "Properties": {"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"}},
        "Master": _group(), "Workers": _group(),
        "WorkersLeave": _schedule("WorkersStopAt", "Workers"),
        "MasterLeaves": _schedule("MasterStopAt", "Master")}}


def test_the_schedules_are_made_at_the_times_read_from_the_block(moto_reset) -> None:
    operator_quotas(moto_reset)
    end = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(microsecond=0)
    block_id = capacity_blocks.purchase_block(
        ACCOUNT, REGION, instance_type="p5.48xlarge", count=2, zone=f"{REGION}a",
        start=end - dt.timedelta(days=3), end=end)
    cfn = boto3.client("cloudformation", endpoint_url=moto_reset, region_name=REGION)
    cfn.create_stack(StackName="S", TemplateBody=json.dumps(template(block_id)))
    assert cfn.describe_stacks(StackName="S")["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    res = {r["LogicalResourceId"]: r["PhysicalResourceId"]
           for r in cfn.describe_stack_resources(StackName="S")["StackResources"]}
    scheduler = boto3.client("scheduler", endpoint_url=moto_reset, region_name=REGION)
    at = {name: scheduler.get_schedule(Name=res[name]) for name in ("WorkersLeave",
                                                                     "MasterLeaves")}
    assert at["WorkersLeave"]["ScheduleExpression"] == \
        f"at({(end - dt.timedelta(minutes=60)):%Y-%m-%dT%H:%M:%S})"
    assert at["MasterLeaves"]["ScheduleExpression"] == \
        f"at({(end - dt.timedelta(minutes=50)):%Y-%m-%dT%H:%M:%S})"
    for name, group in (("WorkersLeave", "Workers"), ("MasterLeaves", "Master")):
        assert at[name]["ScheduleExpressionTimezone"] == "UTC"
        assert json.loads(at[name]["Target"]["Input"]) == {
            "CapacityBlockEnd": {"Group": res[group]}}
    cfn.delete_stack(StackName="S")
    assert not scheduler.list_schedules()["Schedules"]


def test_a_block_the_account_does_not_have_fails_the_deploy(moto_reset) -> None:
    operator_quotas(moto_reset)
    cfn = boto3.client("cloudformation", endpoint_url=moto_reset, region_name=REGION)
    missing = "cr-0123456789abcdef0"
    with pytest.raises(ClientError) as err:
        cfn.create_stack(StackName="S", TemplateBody=json.dumps(template(missing)))
    assert f"Capacity Block {missing} does not exist" in str(err.value)
    ec2 = boto3.client("ec2", endpoint_url=moto_reset, region_name=REGION)
    assert not [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
                if i["State"]["Name"] == "running"]  # no group launched before the refusal

"""A stack's deletion as CloudFormation does it, over moto's HTTP server: a group is scaled
to 0, never force-deleted, so an instance protected from scale-in fails the deletion
(``DELETE_FAILED``, the stack kept, the instance still running) where the emulator once
terminated it; DeleteAutoScalingGroup without ForceDelete refuses a group with instances;
and the stack's ``Custom::ClusterRelease``, deleted before the groups it names, lifts the
protection so the deletion ends with no instance left."""

from __future__ import annotations

import io
import json
import zipfile

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator import cfn_deletion
from tests.conftest import REGION
from tests.support.quotas import operator_quotas


def _group(desired: int) -> dict:
    return {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": {
        "AvailabilityZones": [f"{REGION}a"], "LaunchConfigurationName": {"Ref": "Config"},
        "MinSize": "1", "MaxSize": "4", "DesiredCapacity": str(desired)}}


def template(release: bool) -> dict:
    resources: dict = {
        "Config": {"Type": "AWS::AutoScaling::LaunchConfiguration",
                   "Properties": {"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"}},
        "Master": _group(1), "Workers": _group(2)}
    if release:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            z.writestr("capacity_adjuster.py", "def handler(event, context):\n    pass\n")
        resources |= {
            "Role": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {
                "Version": "2012-10-17", "Statement": [{
                    "Effect": "Allow", "Action": "sts:AssumeRole",
                    "Principal": {"Service": "lambda.amazonaws.com"}}]}}},
            "Adjuster": {"Type": "AWS::Lambda::Function", "Properties": {
                "Handler": "capacity_adjuster.handler", "Runtime": "python3.12",
                "Role": {"Fn::GetAtt": ["Role", "Arn"]},
                "Code": {"ZipFile": "def handler(event, context):\n    pass\n"}}},
            "Release": {"Type": "Custom::ClusterRelease", "DependsOn": ["Master", "Workers"],
                        "Properties": {"ServiceToken": {"Fn::GetAtt": ["Adjuster", "Arn"]},
                                       "Groups": [{"Ref": "Master"}, {"Ref": "Workers"}]}}}
    return {"Resources": resources}


class Deployed:
    def __init__(self, endpoint: str, release: bool) -> None:
        operator_quotas(endpoint)
        self.cfn = boto3.client("cloudformation", endpoint_url=endpoint, region_name=REGION)
        self.asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=REGION)
        self.ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION)
        self.cfn.create_stack(StackName="S", TemplateBody=json.dumps(template(release)))
        res = {r["LogicalResourceId"]: r["PhysicalResourceId"]
               for r in self.cfn.describe_stack_resources(StackName="S")["StackResources"]}
        self.master, self.workers = res["Master"], res["Workers"]

    def ids(self, group: str) -> list[str]:
        (g,) = self.asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[group])["AutoScalingGroups"]
        return sorted(i["InstanceId"] for i in g["Instances"])

    def protect(self) -> list[str]:
        """What the master agent does at formation: the master and a base worker."""
        out = []
        for group, ids in ((self.master, self.ids(self.master)),
                           (self.workers, self.ids(self.workers)[:1])):
            self.asg.set_instance_protection(AutoScalingGroupName=group, InstanceIds=ids,
                                             ProtectedFromScaleIn=True)
            out += ids
        return out

    def running(self) -> set[str]:
        reservations = self.ec2.describe_instances()["Reservations"]
        return {i["InstanceId"] for r in reservations for i in r["Instances"]
                if i["State"]["Name"] not in ("terminated", "shutting-down")}

    def status(self) -> str:
        return self.cfn.describe_stacks(StackName="S")["Stacks"][0]["StackStatus"]


def test_a_protected_instance_fails_the_deletion_and_keeps_running(moto_reset) -> None:
    stack = Deployed(moto_reset, release=False)
    protected = stack.protect()
    stack.cfn.delete_stack(StackName="S")
    assert stack.status() == "DELETE_FAILED"
    assert stack.running() == set(protected), "scaled to 0: only the protected ones are left"
    events = stack.cfn.describe_stack_events(StackName="S")["StackEvents"]
    failed = {e["LogicalResourceId"]: e.get("ResourceStatusReason", "") for e in events
              if e["ResourceStatus"] == "DELETE_FAILED"}
    assert {"Master", "Workers", "S"} <= set(failed)
    assert "protected from scale-in" in failed["Master"] and protected[0] in failed["Master"]
    assert "Config" not in failed  # kept: the groups that use it are still there
    assert stack.cfn.describe_stack_resources(StackName="S")["StackResources"]

    # once the protection is lifted, deleting again ends the stack and the bill
    for group in (stack.master, stack.workers):
        ids = stack.ids(group)
        stack.asg.set_instance_protection(AutoScalingGroupName=group, InstanceIds=ids,
                                          ProtectedFromScaleIn=False)
    stack.cfn.delete_stack(StackName="S")
    assert stack.running() == set()
    with pytest.raises(ClientError):
        stack.status()


def test_delete_group_without_force_refuses_a_group_with_instances(moto_reset) -> None:
    stack = Deployed(moto_reset, release=False)
    with pytest.raises(ClientError) as err:
        stack.asg.delete_auto_scaling_group(AutoScalingGroupName=stack.workers)
    assert err.value.response["Error"]["Code"] == "ResourceInUse"
    assert len(stack.ids(stack.workers)) == 2


def test_the_release_deleted_before_the_groups_lets_the_deletion_end(moto_reset) -> None:
    stack = Deployed(moto_reset, release=True)
    stack.protect()
    stack.cfn.delete_stack(StackName="S")
    assert stack.running() == set(), "no instance left, protected or not"
    with pytest.raises(ClientError):
        stack.status()


def test_dependencies_come_from_depends_on_ref_getatt_and_sub() -> None:
    resources = {
        "A": {"Type": "X"},
        "B": {"Type": "X", "Properties": {"P": {"Ref": "A"}, "Q": {"Ref": "AWS::Region"}}},
        "C": {"Type": "X", "DependsOn": "B",
              "Properties": {"P": {"Fn::Sub": ["${A.Arn}/${D}", {"V": {"Ref": "E"}}]}}},
        "D": {"Type": "X", "Properties": {"P": {"Fn::GetAtt": "E.Arn"}}},
        "E": {"Type": "X", "Properties": {"P": [{"Fn::GetAtt": ["A", "Arn"]}]}}}
    assert cfn_deletion.dependencies(resources) == {
        "A": set(), "B": {"A"}, "C": {"A", "B", "D", "E"}, "D": {"E"}, "E": {"A"}}

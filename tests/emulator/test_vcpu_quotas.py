"""The emulator refuses launches above the account's vCPU quota, as EC2 does
(``emulator/vcpu_quotas.py``): RunInstances answers ``VcpuLimitExceeded`` with EC2's text,
and an Auto Scaling group stops at the quota, publishes the failed launch with that text
and launches the rest once an increase is approved. On the shared in-process emulator
(``moto_reset``: a new account per test)."""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator import capacity, moto_publishing, vcpu_quotas
from lambda_src import launch_errors
from tests.conftest import REGION

G_VT, G_VT_SPOT, STANDARD = "L-DB2E81BA", "L-3819A6DF", "L-1216C47A"
AMI = "ami-12c6146b"


def client(endpoint: str, service: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION)


def raise_quota(endpoint: str, code: str, vcpus: float) -> None:
    """The operator's increase (the emulator approves it at once)."""
    client(endpoint, "service-quotas").request_service_quota_increase(
        ServiceCode="ec2", QuotaCode=code, DesiredValue=vcpus)


def run(ec2: Any, itype: str, count: int = 1, **kwargs: Any) -> list[str]:
    answer = ec2.run_instances(ImageId=AMI, InstanceType=itype, MinCount=count,
                               MaxCount=count, **kwargs)
    return [i["InstanceId"] for i in answer["Instances"]]


def refused(ec2: Any, itype: str, count: int = 1, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as err:
        run(ec2, itype, count, **kwargs)
    assert err.value.response["Error"]["Code"] == "VcpuLimitExceeded"
    return err.value.response["Error"]["Message"]


def test_run_instances_above_the_quota_is_refused_with_ec2s_error(moto_reset: str) -> None:
    ec2 = client(moto_reset, "ec2")
    message = refused(ec2, "g5.xlarge")  # a new account: 0 vCPUs of G and VT
    assert message == ("You have requested more vCPU capacity than your current vCPU limit "
                       "of 0 allows for the instance bucket that the specified instance type "
                       "belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request "
                       "to request an adjustment to this limit.")
    raise_quota(moto_reset, G_VT, 8)
    first = run(ec2, "g5.xlarge", 2)  # 8 of 8 vCPUs
    assert "current vCPU limit of 8 allows" in refused(ec2, "g6.xlarge")  # same class
    run(ec2, "t3.micro", 2)  # Standard is its own class: 4 of 5
    refused(ec2, "t3.micro")  # 6 > 5
    ec2.terminate_instances(InstanceIds=first[:1])  # a terminated instance stops counting
    run(ec2, "g6.xlarge")


def test_spot_counts_against_the_spot_quota(moto_reset: str) -> None:
    ec2 = client(moto_reset, "ec2")
    spot = {"InstanceMarketOptions": {"MarketType": "spot"}}
    raise_quota(moto_reset, G_VT, 4)
    assert "vCPU limit of 0" in refused(ec2, "g5.xlarge", **spot)
    raise_quota(moto_reset, G_VT_SPOT, 4)
    run(ec2, "g5.xlarge", **spot)
    run(ec2, "g5.xlarge")  # the On-Demand quota is untouched by the Spot instance
    refused(ec2, "g5.xlarge", **spot)


def _stack(endpoint: str, desired: int, *, types: list[str]) -> str:
    """A group of ``types`` through CloudFormation (its notification configuration is what
    publishes launch errors), in one subnet; returns the topic's ARN."""
    ec2 = client(endpoint, "ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24",
                               AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
    spec = {"LaunchTemplateId": {"Ref": "Template"},
            "Version": {"Fn::GetAtt": ["Template", "LatestVersionNumber"]}}
    placement: dict[str, Any] = {"LaunchTemplate": spec}
    if len(types) > 1:
        placement = {"MixedInstancesPolicy": {
            "LaunchTemplate": {"LaunchTemplateSpecification": spec,
                               "Overrides": [{"InstanceType": t} for t in types]},
            "InstancesDistribution": {"OnDemandAllocationStrategy": "prioritized"}}}
    template = {"Resources": {
        "Topic": {"Type": "AWS::SNS::Topic"},
        "Template": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {
            "LaunchTemplateData": {"ImageId": AMI, "InstanceType": types[0]}}},
        "Group": {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": {
            "AutoScalingGroupName": "workers", "MinSize": "0", "MaxSize": "8",
            "DesiredCapacity": str(desired), "VPCZoneIdentifier": [subnet],
            "NotificationConfigurations": [{"TopicARN": {"Ref": "Topic"}, "NotificationTypes": [
                capacity.LAUNCH_ERROR, "autoscaling:EC2_INSTANCE_LAUNCH"]}],
            **placement}}}}
    cfn = client(endpoint, "cloudformation")
    cfn.create_stack(StackName="quota", TemplateBody=json.dumps(template))
    return next(r["PhysicalResourceId"] for r in cfn.describe_stack_resources(
        StackName="quota")["StackResources"] if r["LogicalResourceId"] == "Topic")


def _in_group(endpoint: str) -> int:
    return len(client(endpoint, "autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=["workers"])["AutoScalingGroups"][0]["Instances"])


def _launch_errors(topic: str) -> list[dict]:
    return [json.loads(p["message"]) for p in moto_publishing.published()
            if p["topic_arn"] == topic and capacity.LAUNCH_ERROR in p["message"]]


def test_a_group_stops_at_the_quota_reports_it_and_fills_after_an_increase(
        moto_reset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capacity, "RETRY_SECONDS", 1e6)  # the test steps the retries
    later = time.monotonic() + 2e6
    raise_quota(moto_reset, G_VT, 8)  # two g5.xlarge of the three wanted
    topic = _stack(moto_reset, 3, types=["g5.xlarge"])
    assert _in_group(moto_reset) == 2
    [error] = _launch_errors(topic)
    assert error["AutoScalingGroupName"] == "workers" and error["StatusCode"] == "Failed"
    assert error["StatusMessage"].startswith(
        "You have requested more vCPU capacity than your current vCPU limit of 8 allows")
    assert error["StatusMessage"].endswith("Launching EC2 instance failed.")
    assert error["Description"].endswith(error["StatusMessage"])
    assert error["Details"]["Availability Zone"] == f"{REGION}a"
    decided = launch_errors.classify(error["StatusMessage"])
    assert (decided.kind, decided.code) == (launch_errors.FINAL, "VcpuLimitExceeded")
    [activity] = client(moto_reset, "autoscaling").describe_scaling_activities(
        AutoScalingGroupName="workers")["Activities"]
    assert (activity["StatusCode"], activity["StatusMessage"], activity["ActivityId"]) == (
        "Failed", error["StatusMessage"], error["ActivityId"])
    capacity.tick(later)  # the group's retry: still over the quota, a second failure
    assert _in_group(moto_reset) == 2 and len(_launch_errors(topic)) == 2
    raise_quota(moto_reset, G_VT, 12)
    capacity.tick(later)
    assert _in_group(moto_reset) == 3 and len(_launch_errors(topic)) == 2


def test_a_mixed_group_reports_the_fleet_form_and_counts_the_fallback_type(
        moto_reset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The type the prioritized fallback launches is the one whose quota counts: with
    g6.xlarge out, the group launches m5.xlarge (Standard, 4 vCPUs of 5) once."""
    monkeypatch.setattr(capacity, "RETRY_SECONDS", 1e6)
    capacity.set_out(["g6.xlarge"])
    topic = _stack(moto_reset, 2, types=["g6.xlarge", "m5.xlarge"])
    assert _in_group(moto_reset) == 1
    [error] = _launch_errors(topic)
    assert error["StatusMessage"].startswith(
        vcpu_quotas.FLEET_PREFIX + "You have requested more vCPU capacity than your current "
        "vCPU limit of 5 allows")
    assert launch_errors.classify(error["StatusMessage"]).code == "VcpuLimitExceeded"

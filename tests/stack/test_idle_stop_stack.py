"""Idle stop in the stack: the master's controller gets the setting in seconds, and its role
may change the worker group's minimum and desired capacity, and nothing else of any group."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from constructs_lib.validation import ConfigError
from tests.stack.synth import cluster_template


def master_user_data(t: Template) -> str:
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
        text = "".join(p if isinstance(p, str) else "<token>" for p in parts)
        if "--role 'master'" in text:
            return text
    raise AssertionError("no master launch template")


def idle_statements(t: Template) -> list[dict]:
    return [s for p in t.find_resources("AWS::IAM::Policy").values()
            for s in p["Properties"]["PolicyDocument"]["Statement"]
            if s.get("Sid") == "IdleStopOfThisClustersWorkers"]


@pytest.fixture(scope="module")
def default() -> Template:
    return cluster_template()


def test_the_default_is_an_hour_and_the_grant_is_the_worker_groups_sizes_only(default):
    assert "--idle-stop-seconds '3600'" in master_user_data(default)
    (statement,) = idle_statements(default)
    assert statement["Action"] == "autoscaling:UpdateAutoScalingGroup"
    cond = statement["Condition"]
    assert set(cond["StringEquals"]) == {"autoscaling:ResourceTag/dl-cluster:id",
                                         "autoscaling:ResourceTag/NodeType"}
    assert cond["StringEquals"]["autoscaling:ResourceTag/NodeType"] == "Worker"
    assert cond["NumericLessThanEquals"] == {"autoscaling:MinSize": "1"}
    assert cond["Null"] == {key: "true" for key in (
        "autoscaling:LaunchConfigurationName", "autoscaling:LaunchTemplateVersionSpecified",
        "autoscaling:InstanceTypes", "autoscaling:VPCZoneIdentifiers", "autoscaling:MaxSize",
        "autoscaling:CapacityReservationIds",
        "autoscaling:CapacityReservationResourceGroupArns")}


def test_zero_disables_it_and_grants_nothing() -> None:
    t = cluster_template(idleStopMinutes="0")
    assert "--idle-stop-seconds '0'" in master_user_data(t)
    assert idle_statements(t) == []


def test_out_of_bounds_names_the_key_and_value() -> None:
    with pytest.raises(ConfigError, match=r"idleStopMinutes.*10081"):
        cluster_template(idleStopMinutes="10081")

"""Elastic training in the stack (docs/elastic.md): drain hook, permissions, Spot, settings."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match, Template

from constructs_lib.validation import ConfigError
from tests.stack.synth import cluster_template


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template()


def _user_data(t: Template) -> dict[str, str]:
    rendered = {}
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
        text = "".join(p if isinstance(p, str) else "<token>" for p in parts)
        rendered["master" if "--role 'master'" in text else "worker"] = text
    return rendered


def _logical_id(t: Template, kind: str, fragment: str) -> str:
    (found,) = [k for k in t.find_resources(kind) if fragment in k]
    return found


def test_worker_group_has_the_drain_hook_notifying_the_topic(template: Template) -> None:
    hooks = template.find_resources("AWS::AutoScaling::LifecycleHook")
    (hook,) = hooks.values()
    props = hook["Properties"]
    assert props["LifecycleHookName"] == "drain"
    assert props["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert props["HeartbeatTimeout"] == 300
    assert props["DefaultResult"] == "CONTINUE"
    worker_asg = _logical_id(template, "AWS::AutoScaling::AutoScalingGroup", "WorkerGroup")
    topic = _logical_id(template, "AWS::SNS::Topic", "CapacityAdjusterTopic")
    assert props["AutoScalingGroupName"] == {"Ref": worker_asg}
    assert props["NotificationTargetARN"] == {"Ref": topic}
    role = props["RoleARN"]["Fn::GetAtt"][0]
    assert "ClusterCapacityAdjusterFunctionC313C948" in hook["DependsOn"]  # subscribed first
    template.has_resource_properties("AWS::IAM::Role", {
        "AssumeRolePolicyDocument": {"Statement": [Match.object_like({
            "Principal": {"Service": "autoscaling.amazonaws.com"}})]},
    })
    (policy,) = [p for p in template.find_resources("AWS::IAM::Policy").values()
                 if {"Ref": role} in p["Properties"]["Roles"]]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    key = _logical_id(template, "AWS::KMS::Key", "TopicKey")
    assert statements == [
        {"Action": "sns:Publish", "Effect": "Allow", "Resource": {"Ref": topic}},
        {"Action": ["kms:Decrypt", "kms:GenerateDataKey*"], "Effect": "Allow",
         "Resource": {"Fn::GetAtt": [key, "Arn"]}},
    ]


def test_master_role_may_drain_protect_scale_and_mark_only_this_cluster(template: Template) -> None:
    policies = template.find_resources("AWS::IAM::Policy")
    elastic = {}
    for logical_id, policy in policies.items():
        for st in policy["Properties"]["PolicyDocument"]["Statement"]:
            if st.get("Sid") == "ElasticMembershipOfThisCluster":
                elastic[logical_id] = st
    (only,) = elastic  # the master's role, and no other
    assert "MasterGroup" in only
    st = elastic[only]
    assert sorted(st["Action"]) == [
        "autoscaling:CompleteLifecycleAction", "autoscaling:SetDesiredCapacity",
        "autoscaling:SetInstanceHealth",  # the job controller: a failed node is replaced
        "autoscaling:SetInstanceProtection", "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]
    assert st["Condition"] == {
        "StringEquals": {"autoscaling:ResourceTag/dl-cluster:id": "DLClusterStack"}}
    assert "autoScalingGroup:*:autoScalingGroupName/*" in json.dumps(st["Resource"])
    worker_text = json.dumps({k: v for k, v in policies.items() if "WorkerGroupInstance" in k})
    for action in st["Action"]:
        assert action not in worker_text


def test_defaults_no_spot_and_max_equals_worker_count(template: Template) -> None:
    (worker,) = [g for k, g in template.find_resources("AWS::AutoScaling::AutoScalingGroup")
                 .items() if "WorkerGroup" in k]
    props = worker["Properties"]
    assert (props["MinSize"], props["DesiredCapacity"], props["MaxSize"]) == ("1", "2", "2")
    assert "MixedInstancesPolicy" not in props and "LaunchTemplate" in props
    rendered = _user_data(template)
    assert "--base-workers '2'" in rendered["master"]
    assert "--base-workers" not in rendered["worker"]
    assert "--data-prep" not in rendered["master"] + rendered["worker"]


def test_spot_workers_use_a_mixed_policy_above_the_on_demand_base() -> None:
    t = cluster_template(workerCount="2", spotWorkers="3", maxWorkers="8")
    (worker,) = [g for k, g in t.find_resources("AWS::AutoScaling::AutoScalingGroup").items()
                 if "WorkerGroup" in k]
    props = worker["Properties"]
    assert (props["DesiredCapacity"], props["MaxSize"]) == ("5", "8")
    assert props["CapacityRebalance"] is True
    policy = props["MixedInstancesPolicy"]
    assert policy["InstancesDistribution"] == {
        "OnDemandBaseCapacity": 2, "OnDemandPercentageAboveBaseCapacity": 0,
        "SpotAllocationStrategy": "price-capacity-optimized"}
    assert "LaunchTemplateSpecification" in policy["LaunchTemplate"]
    assert "LaunchTemplate" not in props
    assert "--base-workers '2'" in _user_data(t)["master"]


def test_max_workers_and_data_prep_reach_the_group_and_every_node() -> None:
    t = cluster_template(maxWorkers="6", dataPrepScript="/efs/prep.sh 'imagenet'")
    (worker,) = [g for k, g in t.find_resources("AWS::AutoScaling::AutoScalingGroup").items()
                 if "WorkerGroup" in k]
    assert worker["Properties"]["MaxSize"] == "6"
    for role, text in _user_data(t).items():
        assert """--data-prep '/efs/prep.sh '"'"'imagenet'"'"''""" in text, role


def test_construct_rejects_inconsistent_elastic_props() -> None:
    import aws_cdk as cdk

    from constructs_lib import DeepLearningCluster

    for kwargs, message in (
        ({"worker_count": 2, "spot_workers": 2, "max_workers": 3},
         "2 <= 4 <= 3"),
        ({"data_prep_script": "a\nb"}, "^Bad/C: data_prep_script must be one non-empty line"),
        ({"spot_workers": -1}, "^Bad/C: spot_workers must be an integer >= 0, got -1$"),
    ):
        with pytest.raises(ConfigError, match=message):
            DeepLearningCluster(cdk.Stack(cdk.App(), "Bad"), "C", **kwargs)

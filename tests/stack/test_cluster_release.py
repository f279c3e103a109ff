"""The stack's deletion ends: a ``Custom::ClusterRelease`` names both groups, is deleted
before them (it depends on them) and exists before the setup wait (a rollback deletes it
too), and its function may lift protection and lower only this cluster's groups."""

from __future__ import annotations

import json

from tests.stack.synth import cluster_template


def _depends(resource: dict) -> set[str]:
    depends = resource.get("DependsOn") or []
    return {depends} if isinstance(depends, str) else set(depends)


def test_the_release_is_deleted_before_the_groups_and_created_before_the_setup_wait():
    t = cluster_template().to_json()["Resources"]
    (release_id,) = [k for k, v in t.items() if v["Type"] == "Custom::ClusterRelease"]
    release = t[release_id]
    groups = {k for k, v in t.items() if v["Type"] == "AWS::AutoScaling::AutoScalingGroup"}
    assert len(groups) == 2
    assert groups <= _depends(release)
    assert [{"Ref": g} for g in sorted(groups)] == sorted(
        release["Properties"]["Groups"], key=lambda r: r["Ref"])
    (adjuster,) = [k for k, v in t.items() if v["Type"] == "AWS::Lambda::Function"
                   and v["Properties"].get("Handler") == "capacity_adjuster.handler"]
    assert release["Properties"]["ServiceToken"] == {"Fn::GetAtt": [adjuster, "Arn"]}
    (wait,) = [k for k, v in t.items() if v["Type"] == "AWS::CloudFormation::WaitCondition"]
    assert release_id in _depends(t[wait])
    # its grant is there until it is deleted
    (grant,) = [k for k, v in t.items() if v["Type"] == "AWS::IAM::Policy"
                and "ReleaseThisClustersInstancesAtDeletion" in json.dumps(v["Properties"])]
    assert grant in _depends(release)
    statements = {s.get("Sid"): s for s in t[grant]["Properties"]["PolicyDocument"]["Statement"]}
    protect = statements["ReleaseThisClustersInstancesAtDeletion"]
    assert protect["Action"] == "autoscaling:SetInstanceProtection"
    assert list(protect["Condition"]["StringEquals"]) == ["autoscaling:ResourceTag/dl-cluster:id"]
    # UpdateAutoScalingGroup: sizes to 0 only (no template, types, subnets, reservations)
    to_zero = statements["ThisClustersGroupsToZeroAtDeletion"]
    assert to_zero["Action"] == "autoscaling:UpdateAutoScalingGroup"
    assert to_zero["Condition"]["NumericEquals"] == {"autoscaling:MinSize": "0",
                                                     "autoscaling:MaxSize": "0"}
    assert {"autoscaling:VPCZoneIdentifiers", "autoscaling:InstanceTypes",
            "autoscaling:LaunchTemplateVersionSpecified"} <= set(to_zero["Condition"]["Null"])

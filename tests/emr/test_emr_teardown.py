"""The EMR stack's deletion ends: ``Custom::EmrSecurityGroupRelease`` names EMR's three
managed security groups, is deleted after the cluster (the cluster depends on it) and before
the groups (it depends on them), and the template's own rules between groups go before it;
its function may read security groups and revoke rules of those three groups only.
(Its Delete: tests/lambda/test_emr_security_groups.py.)"""

from __future__ import annotations

from tests.emr.conftest import Synth


def _depends(resource: dict) -> set[str]:
    depends = resource.get("DependsOn") or []
    return {depends} if isinstance(depends, str) else set(depends)


def _group_ids(resources: dict) -> dict[str, str]:
    """Logical id of each EMR managed group, by the cluster's property naming it."""
    (cluster,) = [v for v in resources.values() if v["Type"] == "AWS::EMR::Cluster"]
    instances = cluster["Properties"]["Instances"]
    return {key: instances[key]["Fn::GetAtt"][0] for key in (
        "EmrManagedMasterSecurityGroup", "EmrManagedSlaveSecurityGroup",
        "ServiceAccessSecurityGroup")}


def test_the_release_sits_between_the_cluster_and_its_groups(default_synth: Synth,
                                                              custom_synth: Synth) -> None:
    for synth in (default_synth, custom_synth):
        t = synth.resources
        (release_id,) = [k for k, v in t.items()
                         if v["Type"] == "Custom::EmrSecurityGroupRelease"]
        release = t[release_id]
        groups = _group_ids(t)
        assert sorted(release["Properties"]["SecurityGroupIds"], key=str) == sorted(
            ({"Fn::GetAtt": [g, "GroupId"]} for g in groups.values()), key=str)
        # deleted before the groups: it names them (GetAtt), no DependsOn needed
        (cluster_id,) = [k for k, v in t.items() if v["Type"] == "AWS::EMR::Cluster"]
        assert release_id in _depends(t[cluster_id])  # ...and after the cluster
        # the template's rules between groups are deleted before it revokes the rest
        between = [k for k, v in t.items() if v["Type"] in (
            "AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress")
            and v["Properties"]["GroupId"]["Fn::GetAtt"][0] in groups.values()]
        assert between and all(release_id in _depends(t[k]) for k in between)
        (function_id,) = [k for k, v in t.items() if v["Type"] == "AWS::Lambda::Function"
                          and v["Properties"].get("Handler") == "emr_teardown.handler"]
        assert release["Properties"]["ServiceToken"] == {"Fn::GetAtt": [function_id, "Arn"]}


def test_the_function_revokes_rules_of_the_three_groups_only(default_synth: Synth) -> None:
    t = default_synth.resources
    groups = set(_group_ids(t).values())
    (release_id,) = [k for k, v in t.items() if v["Type"] == "Custom::EmrSecurityGroupRelease"]
    (policy_id,) = [k for k, v in t.items() if v["Type"] == "AWS::IAM::Policy"
                    and "RevokeRulesOfTheManagedGroupsOnly" in str(v["Properties"])]
    assert policy_id in _depends(t[release_id])  # its Delete still has the grant
    statements = {s["Sid"]: s for s in
                  t[policy_id]["Properties"]["PolicyDocument"]["Statement"] if "Sid" in s}
    revoke = statements["RevokeRulesOfTheManagedGroupsOnly"]
    assert sorted(revoke["Action"]) == ["ec2:RevokeSecurityGroupEgress",
                                        "ec2:RevokeSecurityGroupIngress"]
    named = {part["Fn::GetAtt"][0] for arn in revoke["Resource"]
             for part in arn["Fn::Join"][1] if isinstance(part, dict) and "Fn::GetAtt" in part}
    assert named == groups
    read = statements["ReadTheGroupsRules"]
    assert (read["Action"], read["Resource"]) == ("ec2:DescribeSecurityGroups", "*")
    actions = {a for s in t[policy_id]["Properties"]["PolicyDocument"]["Statement"]
               for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions <= {"ec2:DescribeSecurityGroups", "ec2:RevokeSecurityGroupIngress",
                       "ec2:RevokeSecurityGroupEgress", "logs:CreateLogStream",
                       "logs:PutLogEvents"}

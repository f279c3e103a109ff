"""The stack checks the account's vCPU quotas itself, before either group launches: a
``Custom::QuotaCheck`` both groups depend on, with the nodes as first launched; none for a
Capacity Block (its instances use no On-Demand quota)."""

from __future__ import annotations

from tests.stack.synth import cluster_template


def _depends(resource: dict) -> set[str]:
    depends = resource.get("DependsOn") or []
    return {depends} if isinstance(depends, str) else set(depends)


def test_both_groups_wait_for_the_quota_check_of_the_nodes_they_launch():
    t = cluster_template(workerCount="3", spotWorkers="2",
                         workerInstanceType="p5.48xlarge").to_json()["Resources"]
    (check_id,) = [k for k, v in t.items() if v["Type"] == "Custom::QuotaCheck"]
    groups = [v for v in t.values() if v["Type"] == "AWS::AutoScaling::AutoScalingGroup"]
    assert len(groups) == 2 and all(check_id in _depends(g) for g in groups)
    nodes = t[check_id]["Properties"]["Nodes"]
    assert [(n["Key"], n["InstanceType"], n["Count"], n["Spot"]) for n in nodes] == [
        ("masterInstanceType", "g5.xlarge", 1, False),
        ("workerInstanceType", "p5.48xlarge", 3, False),
        ("spotWorkers", "p5.48xlarge", 2, True)]
    (adjuster,) = [k for k, v in t.items() if v["Type"] == "AWS::Lambda::Function"
                   and v["Properties"].get("Handler") == "capacity_adjuster.handler"]
    assert t[check_id]["Properties"]["ServiceToken"] == {"Fn::GetAtt": [adjuster, "Arn"]}
    (grant,) = [s for v in t.values() if v["Type"] == "AWS::IAM::Policy"
                for s in v["Properties"]["PolicyDocument"]["Statement"]
                if s.get("Sid") == "ReadVcpuQuotasAndInstanceTypes"]
    assert sorted(grant["Action"]) == ["ec2:DescribeInstanceTypes",
                                       "servicequotas:GetServiceQuota",
                                       "servicequotas:ListAWSDefaultServiceQuotas"]


def test_a_capacity_block_has_no_quota_check():
    t = cluster_template(capacityBlockId="cr-0123456789abcdef0",
                         availabilityZones="us-east-1a,us-east-1b",
                         workerInstanceType="p5.48xlarge",
                         masterInstanceType="p5.48xlarge").to_json()["Resources"]
    assert not [k for k, v in t.items() if v["Type"] == "Custom::QuotaCheck"]

"""The node groups start only after their subnets can reach S3 and SSM: each group depends
on the default route (through the NAT gateway) of every private subnet it launches into."""

from __future__ import annotations

from tests.stack.synth import cluster_template


def test_each_node_group_waits_for_its_subnets_nat_routes():
    resources = cluster_template().to_json()["Resources"]
    nat_routes = {k for k, v in resources.items() if v["Type"] == "AWS::EC2::Route"
                  and "NatGatewayId" in v["Properties"]}
    assert nat_routes, "the VPC has no NAT route"
    groups = {k: v for k, v in resources.items()
              if v["Type"] == "AWS::AutoScaling::AutoScalingGroup"}
    assert len(groups) == 2
    for logical_id, group in groups.items():
        depends = set(group.get("DependsOn", []))
        assert nat_routes <= depends, f"{logical_id} does not wait for {nat_routes - depends}"

"""The master role may ask EC2 for instance types (the health gate); the workers may not."""

from __future__ import annotations

from tests.stack.synth import cluster_template


def statements_by_role(template) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for policy in template.find_resources("AWS::IAM::Policy").values():
        props = policy["Properties"]
        for role in props.get("Roles", []):
            out.setdefault(role["Ref"], []).extend(props["PolicyDocument"]["Statement"])
    return out


def test_only_the_master_role_calls_describe_instance_types():
    """Of the nodes, only the master asks (the gate's GPU counts); the capacity adjuster's role
    asks too, for the stack's quota check (the vCPUs of each type, Custom::QuotaCheck)."""
    by_role = statements_by_role(cluster_template())
    holders = {role: [s for s in stmts if "ec2:DescribeInstanceTypes" in
                      ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
               for role, stmts in by_role.items()}
    holders = {role: s for role, s in holders.items() if s}
    adjuster = [r for r in holders if r.startswith("ClusterCapacityAdjusterRole")]
    assert len(adjuster) == 1, holders
    assert any("servicequotas:GetServiceQuota" in s["Action"] for s in holders.pop(adjuster[0]))
    assert len(holders) == 1, holders
    (role, (stmt,)), = holders.items()
    assert "MasterGroup" in role, role
    assert stmt == {"Action": "ec2:DescribeInstanceTypes", "Effect": "Allow", "Resource": "*",
                    "Sid": "GpuCountsOfInstanceTypes"}

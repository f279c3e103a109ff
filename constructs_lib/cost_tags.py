"""The cluster's cost tag on everything that bills apart from the instances.

AWS Budgets and Cost Explorer count a cost under ``dl-cluster:id=<cluster id>`` only if the
resource that incurs it carries the tag. The Auto Scaling groups tag their instances, and
the launch templates their volumes (``node_group.py``); the shared file systems, the NAT
gateways and their addresses, the checkpoint bucket, the log groups and any interface
endpoints bill on their own lines, so each of those carries the tag too. A user-defined tag
counts only once it is activated as a cost allocation tag in the payer account's Billing
console, up to 24 hours after it first appears
(https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/activating-tags.html):
docs/cost.md says so.

Only the cluster's own resources are tagged (an imported VPC's NAT or file system is the
owner's), and only those that are a cost line: the tag is not spread over the whole stack,
because IAM conditions elsewhere read ``dl-cluster:id`` to scope what a role may touch.
"""

from __future__ import annotations

from aws_cdk import CfnResource, Tags
from constructs import IConstruct

#: CloudFormation types that are a cost line of their own (and take tags).
COST_BEARING_TYPES = frozenset({
    "AWS::EFS::FileSystem", "AWS::FSx::FileSystem", "AWS::EC2::NatGateway", "AWS::EC2::EIP",
    "AWS::EC2::VPCEndpoint", "AWS::Logs::LogGroup", "AWS::S3::Bucket",
})


def tag_cost_bearing(scope: IConstruct, key: str, value: str) -> list[str]:
    """``key=value`` on every cost-bearing resource under ``scope``; their paths, in order."""
    tagged = []
    for child in scope.node.find_all():
        if isinstance(child, CfnResource) and child.cfn_resource_type in COST_BEARING_TYPES:
            Tags.of(child).add(key, value)
            tagged.append(child.node.path)
    return tagged

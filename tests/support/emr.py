"""EMR clusters on moto's server, for the membership and dl-submit tests.

moto populates a ``run_job_flow`` cluster with instances (random 10.x addresses, the real
GPU counts in DescribeInstanceTypes); a cluster deployed through CloudFormation has none.
"""

from __future__ import annotations

import boto3

from tests.conftest import REGION


def make_cluster(endpoint: str, *, core: int = 3, core_type: str = "g5.12xlarge") -> str:
    """A running cluster of 1 g5.xlarge primary + ``core`` core nodes; returns its id."""
    emr = boto3.client("emr", region_name=REGION, endpoint_url=endpoint)
    return emr.run_job_flow(
        Name="dl-emr-test", ReleaseLabel="emr-7.12.0", JobFlowRole="role", ServiceRole="svc",
        Instances={"InstanceGroups": [
            {"InstanceRole": "MASTER", "InstanceType": "g5.xlarge", "InstanceCount": 1,
             "Market": "ON_DEMAND", "Name": "Primary"},
            {"InstanceRole": "CORE", "InstanceType": core_type, "InstanceCount": core,
             "Market": "ON_DEMAND", "Name": "Core"}],
            "KeepJobFlowAliveWhenNoSteps": True},
        Tags=[{"Key": "dl-cluster:id", "Value": "dl-emr-test"}])["JobFlowId"]


def instances_of(endpoint: str, cluster_id: str) -> tuple[dict, list[dict]]:
    """Independent view (EMR API directly): the primary and the core nodes."""
    emr = boto3.client("emr", region_name=REGION, endpoint_url=endpoint)
    primary = emr.list_instances(ClusterId=cluster_id, InstanceGroupTypes=["MASTER"])["Instances"]
    core = emr.list_instances(ClusterId=cluster_id, InstanceGroupTypes=["CORE"])["Instances"]
    assert len(primary) == 1
    return primary[0], core

"""Fixtures of the node-side security drills (``tests/security/test_node_*.py``): a real
unprivileged user, and an emulated cluster whose instances are moto's, so that what the
master's job controller asks of Auto Scaling shows in moto's group state.

The user and the interpreter's reachability are the job-owner suite's own fixtures
(``tests/runner/test_job_owner.py``), imported rather than copied.
"""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from emulator.resources import ClusterResources, create_cluster
from tests.conftest import REGION
from tests.support.cluster import LocalCluster
from tests.support.users import cluster_for_users, job_user, reachable_python, run_as

__all__ = ["aws_cluster", "group_health", "job_user", "moto_env", "reachable_python",
           "run_as"]


def moto_env(endpoint: str) -> dict[str, str]:
    """What a node's root processes get to reach AWS (here: moto's server)."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION}


def group_health(endpoint: str) -> dict[str, str]:
    """Every instance's health status in Auto Scaling (moto's state), by instance id."""
    asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=REGION)
    return {i["InstanceId"]: i["HealthStatus"].lower()
            for i in asg.describe_auto_scaling_instances()["AutoScalingInstances"]}


@pytest.fixture()
def aws_cluster(moto_reset, job_user, reachable_python
                ) -> Iterator[tuple[LocalCluster, ClusterResources]]:
    """A master and a worker on moto's instances, executors running, in a directory every
    user can reach (pytest's temporary directory is private to root); the controller is
    left to the test (it may want other settings)."""
    res = create_cluster(moto_reset, cluster_id="sec-nodes", workers=1)
    with cluster_for_users("dl-secnodes-", 2, instances=res.node_instances("master")
                           + res.node_instances("worker")) as c:
        c.start_executors()
        yield c, res

"""The master's idle stop answered by the capacity adjuster (``cluster_release.
release_idle_master``, dispatched by ``capacity_adjuster.handler``): the master group of this
cluster is released with the stack deletion's own code (protection lifted, sizes to 0), a
request that comes late (the instance that asked is gone, a woken master runs) changes
nothing, and a group that is not this cluster's master group is refused. Against moto."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from adjuster_harness import Cloud, import_adjuster, lambda_environment
from moto import mock_aws

from bootstrap_scripts.jobs.controller import idle_master
from lambda_src import cluster_release

adjuster = import_adjuster()
MASTER = "DLClusterStack-MasterGroupASG-BBBB"
WORKERS = "DLClusterStack-WorkerGroupASG-AAAA"


@pytest.fixture()
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        c = Cloud()
        lambda_environment(monkeypatch, c.queue())
        yield c


def test_the_two_sides_name_the_same_event_key() -> None:
    """The controller builds the request in bootstrap_scripts, the function reads it in
    lambda_src: two assets, one key."""
    event = idle_master.release_request(MASTER, "i-1")
    assert cluster_release.is_idle_master_request(event)
    assert idle_master.IDLE_MASTER_KEY == cluster_release.IDLE_MASTER_KEY


def test_the_protected_master_is_released_and_its_group_left_at_zero(cloud: Cloud) -> None:
    [master] = cloud.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    cloud.asg.set_instance_protection(AutoScalingGroupName=MASTER, InstanceIds=[master],
                                      ProtectedFromScaleIn=True)
    done = adjuster.handler(idle_master.release_request(MASTER, master), None)
    assert done["released"] == [master] and not done["skipped"]
    group = cloud.describe(MASTER)
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 0, 0)
    assert group["Instances"] == []


def test_a_late_request_leaves_a_woken_master_alone(cloud: Cloud) -> None:
    [master] = cloud.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    cloud.asg.set_instance_protection(AutoScalingGroupName=MASTER, InstanceIds=[master],
                                      ProtectedFromScaleIn=True)
    done = adjuster.handler(idle_master.release_request(MASTER, "i-0123456789abcdef0"), None)
    assert done["released"] == [] and "no longer in the group" in done["skipped"]
    group = cloud.describe(MASTER)
    assert group["DesiredCapacity"] == 1 and group["Instances"][0]["ProtectedFromScaleIn"]


def test_the_worker_group_or_another_clusters_master_is_refused(cloud: Cloud) -> None:
    workers = cloud.group(WORKERS, min_size=1, desired=2, max_size=2)
    with pytest.raises(ValueError, match="not the master group"):
        adjuster.handler(idle_master.release_request(WORKERS, workers[0]), None)
    other = "Other-MasterGroupASG-CCCC"
    [theirs] = cloud.group(other, min_size=1, desired=1, max_size=1, role="Master",
                           cluster_id="OtherCluster")
    with pytest.raises(ValueError, match="not the master group"):
        adjuster.handler(idle_master.release_request(other, theirs), None)
    assert cloud.describe(WORKERS)["DesiredCapacity"] == 2
    assert cloud.describe(other)["DesiredCapacity"] == 1

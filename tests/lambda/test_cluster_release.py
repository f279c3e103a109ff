"""The stack's ``Custom::ClusterRelease`` answered by the capacity adjuster: its Delete lifts
scale-in protection and lowers both groups to 0, so CloudFormation's deletion of the groups
(which never force-deletes) ends with no instance left; Create and Update do nothing; the
answer is PUT to the request's presigned URL with an empty Content-Type."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from adjuster_harness import Cloud, import_adjuster, lambda_environment
from moto import mock_aws

from emulator.wait_handle import WaitHandle
from lambda_src import cluster_release

adjuster = import_adjuster()
WORKERS = "DLClusterStack-WorkerGroupASG-AAAA"
MASTER = "DLClusterStack-MasterGroupASG-BBBB"


@pytest.fixture()
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        c = Cloud()
        lambda_environment(monkeypatch, c.queue())
        yield c


@pytest.fixture()
def handle() -> Iterator[WaitHandle]:
    h = WaitHandle()
    yield h
    h.stop()


def request(kind: str, url: str, groups: list[str]) -> dict[str, Any]:
    event = {"RequestType": kind, "ResponseURL": url, "StackId": "arn:stack/S/1",
             "RequestId": "r-1", "LogicalResourceId": "ClusterRelease",
             "ResourceType": cluster_release.RESOURCE_TYPE,
             "ResourceProperties": {"ServiceToken": "arn:fn", "Groups": groups}}
    if kind != "Create":
        event["PhysicalResourceId"] = "ClusterRelease-clusterrelease"
    return event


def protect(c: Cloud, group: str, ids: list[str]) -> None:
    c.asg.set_instance_protection(AutoScalingGroupName=group, InstanceIds=ids,
                                  ProtectedFromScaleIn=True)


def test_delete_lifts_protection_and_lowers_both_groups_to_zero(
        cloud: Cloud, handle: WaitHandle) -> None:
    master = cloud.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    workers = cloud.group(WORKERS, min_size=1, desired=3, max_size=4)
    protect(cloud, MASTER, master)
    protect(cloud, WORKERS, workers[:2])  # the base workers, as the master agent does
    adjuster.handler(request("Delete", handle.url, [MASTER, WORKERS]), None)
    [answer] = handle.signals
    assert answer["Status"] == "SUCCESS", answer
    assert answer["PhysicalResourceId"] == "ClusterRelease-clusterrelease"
    assert (answer["RequestId"], answer["LogicalResourceId"]) == ("r-1", "ClusterRelease")
    assert "released 3 protected instance(s)" in answer["Reason"]
    assert handle.headers[0].get("Content-Type", "") == ""
    for name in (MASTER, WORKERS):
        group = cloud.describe(name)
        assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 0, 0)
        assert not [i for i in group["Instances"] if i.get("ProtectedFromScaleIn")]
        assert group["Instances"] == [], "nothing left for CloudFormation to wait on"


def test_create_and_update_change_nothing(cloud: Cloud, handle: WaitHandle) -> None:
    master = cloud.group(MASTER, min_size=1, desired=1, max_size=1, role="Master")
    protect(cloud, MASTER, master)
    for kind in ("Create", "Update"):
        adjuster.handler(request(kind, handle.url, [MASTER]), None)
    assert [s["Status"] for s in handle.signals] == ["SUCCESS", "SUCCESS"]
    assert handle.signals[0]["PhysicalResourceId"] == "ClusterRelease-clusterrelease"
    group = cloud.describe(MASTER)
    assert group["DesiredCapacity"] == 1 and group["Instances"][0]["ProtectedFromScaleIn"]


def test_delete_of_groups_already_gone_succeeds(cloud: Cloud, handle: WaitHandle) -> None:
    adjuster.handler(request("Delete", handle.url, [MASTER, WORKERS]), None)
    assert handle.signals[0]["Status"] == "SUCCESS"


def test_a_malformed_request_answers_failed_naming_the_property(handle: WaitHandle) -> None:
    """Never raised: CloudFormation would wait an hour for an answer."""
    event = request("Delete", handle.url, [])
    event["ResourceProperties"]["Groups"] = "one-group"
    body = cluster_release.respond(event, autoscaling=None)
    assert body["Status"] == "FAILED" and "Groups must be a list" in body["Reason"]


class Reprotecting:
    """An Auto Scaling client whose instance the master agent protects again once, between
    the release's lift and its capacity change (a membership published at that moment)."""

    def __init__(self) -> None:
        self.protected, self.lifts, self.updates, self.again = True, 0, 0, 1

    def describe_auto_scaling_groups(self, AutoScalingGroupNames: list[str]) -> dict:
        return {"AutoScalingGroups": [{
            "AutoScalingGroupName": MASTER, "MinSize": 0, "MaxSize": 0,
            "DesiredCapacity": 0 if self.updates else 1,
            "Instances": [{"InstanceId": "i-1", "LifecycleState": "InService",
                           "ProtectedFromScaleIn": self.protected}]}]}

    def set_instance_protection(self, **kwargs: Any) -> None:
        self.lifts += 1
        self.protected = False

    def update_auto_scaling_group(self, **kwargs: Any) -> None:
        self.updates += 1
        if self.again:
            self.again, self.protected = self.again - 1, True


def test_protection_set_again_meanwhile_is_lifted_in_the_next_round() -> None:
    client = Reprotecting()
    assert cluster_release.release(client, [MASTER], sleep=lambda s: None) == ["i-1"]
    assert client.lifts == 2 and not client.protected


def test_protection_that_keeps_coming_back_fails_naming_the_instance() -> None:
    client = Reprotecting()
    client.again = 10**6  # protected again after every change
    with pytest.raises(RuntimeError, match="i-1"):
        cluster_release.release(client, [MASTER], sleep=lambda s: None)

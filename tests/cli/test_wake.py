"""``dlc`` and a master the idle stop stopped (``dlc/wake.py``), against moto's server over
HTTP: ``dlc status`` says the master is stopped and how to wake it; ``dlc submit``'s wake
sets the master group back to one (the one call the operator policy allows for it), waits
with a line per change until the new master answers, and gives up past its bound naming
what it saw last. Auto Scaling launching the instance is moto's; the master answering
``dl-health`` (its boot, its SSM Agent) is played in-process by ``ready``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest

from dlc import status, wake
from dlc.errors import DlcError
from dlc.target import resolve

REGION = "us-east-1"
STACK = "WakeStack"
MASTER, WORKERS = "WakeStack-MasterGroup-1", "WakeStack-WorkerGroup-1"
TEMPLATE = {
    "Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
    "Outputs": {"MasterGroupName": {"Value": MASTER}, "WorkerGroupName": {"Value": WORKERS}},
}


@pytest.fixture()
def cluster(moto_reset: str, tmp_path: Path):
    """A stack naming its two groups, the master group as the idle stop leaves it (0, 0, 0)
    and the worker group stopped; ``dlc``'s target on moto's server."""
    kw = dict(endpoint_url=moto_reset, region_name=REGION)
    ec2, asg = boto3.client("ec2", **kw), boto3.client("autoscaling", **kw)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.create_launch_template(LaunchTemplateName="node", LaunchTemplateData={
        "ImageId": ami, "InstanceType": "m5.large"})  # no G quota
    for name, role in ((MASTER, "Master"), (WORKERS, "Worker")):
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=0, MaxSize=0 if role == "Master" else 2,
            DesiredCapacity=0, AvailabilityZones=[f"{REGION}a"],
            LaunchTemplate={"LaunchTemplateName": "node", "Version": "$Latest"},
            Tags=[{"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": k,
                   "Value": v, "PropagateAtLaunch": True}
                  for k, v in (("dl-cluster:id", STACK), ("NodeType", role))])
    boto3.client("cloudformation", **kw).create_stack(StackName=STACK,
                                                      TemplateBody=json.dumps(TEMPLATE))
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"endpoint": moto_reset, "aws": {
        "endpoint": moto_reset, "region": REGION, "access_key_id": "testing",
        "secret_access_key": "testing", "session_token": "testing"}}))
    return resolve(stack=STACK, emulator=str(state)), asg


def master(asg) -> dict:
    return asg.describe_auto_scaling_groups(AutoScalingGroupNames=[MASTER])[
        "AutoScalingGroups"][0]


def test_status_says_the_master_is_stopped_and_how_to_wake_it(cluster) -> None:
    target, _ = cluster
    st = status.gather(target, with_cost=False)
    assert st["master_stopped"] is True
    assert "dlc up or dlc submit wakes it" in st["errors"]["master"]
    from rich.console import Console

    console = Console(record=True, width=200)
    status.render(console, st)
    assert wake.STOPPED_NOTE in console.export_text()


def test_submit_wakes_the_master_and_waits_until_it_answers(cluster, monkeypatch) -> None:
    target, asg = cluster
    monkeypatch.setattr(wake, "POLL", 0.05)
    lines: list[str] = []
    answers = iter(["not answering yet (no SSM Agent)", ""])
    asked: list[str] = []

    def ready(iid: str) -> str:
        asked.append(iid)
        return next(answers)

    assert wake.ensure_awake(target, lines.append, seconds=60, ready=ready) is True
    g = master(asg)
    assert (g["MinSize"], g["MaxSize"], g["DesiredCapacity"]) == (1, 1, 1)
    [instance] = g["Instances"]
    assert asked == [instance["InstanceId"]] * 2
    assert lines[0].startswith("the master is stopped (idle stop, idleStopMasterMinutes)")
    assert f"{MASTER} 0 -> 1" in lines[0]
    assert any("not answering yet" in line for line in lines)
    assert lines[-1] == f"master {instance['InstanceId']} is back"
    assert status.gather(target, with_cost=False)["master_stopped"] is False
    lines.clear()
    assert wake.ensure_awake(target, lines.append, ready=ready) is False, "awake: no call"
    assert lines == []


def test_the_wait_is_bounded_and_names_what_it_saw_last(cluster, monkeypatch) -> None:
    target, asg = cluster
    monkeypatch.setattr(wake, "POLL", 0.05)
    wake.start(target, master(asg), lambda s: None)
    with pytest.raises(DlcError, match=r"did not come back in time \(last seen: i-\w+ "
                                       r"InService, still booting\)"):
        wake.wait(target, MASTER, lambda s: None, time.monotonic() + 0.2,
                  ready=lambda iid: "still booting")

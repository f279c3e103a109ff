"""Test support: a cluster's AWS side in moto, and the observers the agent talks to.

Creates what the stack would (VPC 127.20.0.0/16 so moto hands out loopback addresses,
master subnet 127.20.0.0/24, worker subnet 127.20.128.0/24, a launch template, two tagged
Auto Scaling groups, the two queues), sends ``asg-setup`` messages shaped as the Lambda's,
and records wait-condition signals on a local HTTP server.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3

from tests.conftest import REGION, REPO_ROOT


@dataclass
class FakeCluster:
    endpoint: str
    cluster_id: str
    master_asg: str
    worker_asg: str
    master_queue_url: str
    worker_queue_url: str

    def client(self, service: str):
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION)

    def instances(self, role: str) -> list[tuple[str, str]]:
        """(instance id, private IP) of the group's live instances, in group order."""
        name = self.master_asg if role == "master" else self.worker_asg
        group = self.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
        ids = [i["InstanceId"] for i in group["Instances"]
               if i["LifecycleState"] in ("InService", "Pending")]
        if not ids:
            return []
        ips = {}
        for res in self.client("ec2").describe_instances(InstanceIds=ids)["Reservations"]:
            for inst in res["Instances"]:
                ips[inst["InstanceId"]] = inst["PrivateIpAddress"]
        return [(i, ips[i]) for i in ids]

    def setup_message(self, role: str, *, status: str = "success", reason: str = "") -> dict:
        name = self.master_asg if role == "master" else self.worker_asg
        group = self.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
        ids = [i["InstanceId"] for i in group["Instances"]]
        key = hashlib.sha256(f"{name}{sorted(ids)}{status}".encode()).hexdigest()[:16]
        return {"event": "asg-setup", "status": status, "asg": name, "role": role,
                "cluster_id": self.cluster_id, "min": group["MinSize"],
                "desired": group["DesiredCapacity"], "max": group["MaxSize"],
                "launched": len(ids), "instances": ids,
                "reason": reason or f"{len(ids)} of {group['DesiredCapacity']} launched",
                "cause": "", "dedupe_key": key,
                "sent_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def change_message(self, role: str, change: str, instance_id: str) -> dict:
        name = self.master_asg if role == "master" else self.worker_asg
        return {"event": "membership-change", "change": change, "asg": name, "role": role,
                "cluster_id": self.cluster_id, "instance_id": instance_id, "desired": 3,
                "launched": 3, "dedupe_key": uuid.uuid4().hex,
                "sent_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def send(self, body: dict | str) -> None:
        text = body if isinstance(body, str) else json.dumps(body)
        self.client("sqs").send_message(QueueUrl=self.master_queue_url, MessageBody=text)

    def queue_depth(self) -> int:
        attrs = self.client("sqs").get_queue_attributes(
            QueueUrl=self.master_queue_url,
            AttributeNames=["ApproximateNumberOfMessages",
                            "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]) + int(
            attrs["ApproximateNumberOfMessagesNotVisible"])


def create_cluster(endpoint: str, *, cluster_id: str = "dlc-test", workers: int = 3,
                   worker_type: str = "p3.2xlarge") -> FakeCluster:
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION)
    asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=REGION)
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="127.20.0.0/16")["Vpc"]["VpcId"]
    master_subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.20.0.0/24")["Subnet"]["SubnetId"]
    worker_subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.20.128.0/24")["Subnet"][
        "SubnetId"]
    names = {}
    for role, subnet, count in (("Master", master_subnet, 1), ("Worker", worker_subnet, workers)):
        lt = f"{cluster_id}-{role.lower()}-lt"
        ec2.create_launch_template(LaunchTemplateName=lt, LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": worker_type,
            "MetadataOptions": {"HttpTokens": "required"}})
        name = f"{cluster_id}-{role}Group-{uuid.uuid4().hex[:8]}"
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateName": lt, "Version": "$Latest"},
            MinSize=1 if role == "Master" else 0, MaxSize=max(count, 1) + 1,
            DesiredCapacity=count, VPCZoneIdentifier=subnet,
            Tags=[{"Key": "dl-cluster:id", "Value": cluster_id, "PropagateAtLaunch": True},
                  {"Key": "NodeType", "Value": role, "PropagateAtLaunch": True}])
        names[role] = name
    queues = {r: sqs.create_queue(QueueName=f"{cluster_id}-{r}")["QueueUrl"]
              for r in ("master", "worker")}
    return FakeCluster(endpoint, cluster_id, names["Master"], names["Worker"],
                       queues["master"], queues["worker"])


class SignalRecorder:
    """A stand-in for the wait-condition handle's presigned URL: records every PUT."""

    def __init__(self) -> None:
        self.signals: list[dict] = []
        self.headers: list[dict] = []
        self._cond = threading.Condition()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with recorder._cond:
                    recorder.headers.append(dict(self.headers))
                    recorder.signals.append(json.loads(body))
                    recorder._cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        # A presigned-looking URL: query string full of %-escapes, as S3's are.
        self.url = (f"http://{host}:{port}/waitcondition/handle?X-Amz-Signature=ab%2Fcd"
                    "&X-Amz-Expires=86400")

    def wait_for(self, count: int = 1, timeout: float = 60.0) -> list[dict]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.signals) >= count, timeout=timeout)
            return list(self.signals)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def fake_nvidia_smi(directory: Path, gpus: int) -> Path:
    """A directory holding an ``nvidia-smi`` that lists ``gpus`` GPUs (prepend it to PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"GPU {g}: Tesla V100-SXM2-16GB (UUID: GPU-{g:08d}-fake)\\n"
                    for g in range(gpus))
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\nprintf '{lines}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def agent_argv(cluster: FakeCluster, role: str, root: Path, efs: Path, wait_handle: str,
               *extra: str) -> list[str]:
    return ["--role", role, "--cluster-id", cluster.cluster_id, "--stack-name",
            cluster.cluster_id, "--region", REGION, "--master-queue-url",
            cluster.master_queue_url, "--worker-queue-url", cluster.worker_queue_url,
            "--efs-id", "", "--mount-point", str(efs), "--wait-handle", wait_handle,
            "--setup-timeout", "120", "--root", str(root), "--no-mount", *extra]


class AgentProcesses:
    """Agent subprocesses, each stopped by PID (SIGTERM, then SIGKILL) at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.procs: dict[str, subprocess.Popen] = {}
        self.log_dir = log_dir

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.out", "wb")  # noqa: SIM115 - closed by the process
        full_env = {**os.environ, "PYTHONPATH": REPO_ROOT, **env}
        proc = subprocess.Popen([sys.executable, "-m", "bootstrap_scripts.node_agent", *argv],
                                cwd=REPO_ROOT, env=full_env, stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        self.procs[name] = proc
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        _terminate(proc)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def output(self, name: str) -> str:
        return (self.log_dir / f"{name}.out").read_text(errors="replace")


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.05, what: str = ""):
    """Poll ``predicate`` until truthy; raise AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)

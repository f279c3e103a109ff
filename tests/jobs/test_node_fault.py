"""A node fault in a managed job: the worker's machine dies (its executor and its share),
root's own record (the executor heartbeat) confirms it, and the controller marks exactly
that instance Unhealthy in Auto Scaling (moto's real server) and restarts the job on the
survivors. (A share killed by SIGKILL alone is the job's: tests/security.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import ShareStarted
from emulator.resources import create_cluster
from tests.conftest import REGION

pytestmark = pytest.mark.slow
JOB = str(Path(__file__).parent / "jobs" / "managed_job.py")


def wait_for(what: str, check, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_lost_node_is_marked_unhealthy_and_the_job_restarts_on_survivors(
        emu, moto_reset):
    res = create_cluster(moto_reset, cluster_id="jobs-fault", workers=1)
    c = emu(2, instances=res.node_instances("master") + res.node_instances("worker"))
    c.start_executors()
    c.start_controller({"AWS_ENDPOINT_URL": moto_reset, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION,
                        "AWS_DEFAULT_REGION": REGION})
    out = c.run("--detach", "--json", "--launcher", "each", "--fail-grace", "1",
                "--min-nodes", "1", "--replace-timeout", "2", "--", "python", JOB,
                "--sleep-first", "120", managed=True, timeout=60)
    assert out.returncode == 0, out.stdout
    job_id = json.loads(out.stdout.strip().splitlines()[-1])["job_id"]
    first = ClusterPaths(c.efs).job(f"{job_id}.1")
    wait_for("attempt 1's shares", lambda: all(store.exists(first.started(r)) for r in (0, 1)))
    master, worker = c.membership.nodes
    c.node(worker.address).kill([store.read_record(first.started(1), ShareStarted).pgid])

    record = ClusterPaths(c.efs).managed(job_id).record
    wait_for("the job to end", lambda: (store.read_record_or_none(record, ManagedJob) or
                                        ManagedJob(job_id="", state="")).state in (
        "succeeded", "failed", "cancelled"), 120)
    job = store.read_record(record, ManagedJob)
    assert (job.state, job.attempt, job.restarts, job.world_size) == ("succeeded", 2, 1, 1), \
        (job, c.controller_log())
    (restart,) = job.restart_log
    assert (restart.kind, restart.address, restart.instance_id, restart.marked_unhealthy,
            restart.next_world_size) == ("node-lost", worker.address, worker.instance_id,
                                         True, 1), restart
    assert restart.seconds_to_resume is not None and restart.seconds_to_resume >= 2
    assert worker.instance_id in job.excluded

    asg = boto3.client("autoscaling", endpoint_url=moto_reset, region_name=REGION)
    health = {i["InstanceId"]: i["HealthStatus"].lower() for i in
              asg.describe_auto_scaling_instances()["AutoScalingInstances"]}
    assert health == {master.instance_id: "healthy", worker.instance_id: "unhealthy"}

    logs = c.dl_jobs("logs", job_id)
    assert logs.returncode == 0, logs.stderr
    assert f"job={job_id}.2 restart=1 resume=1" in logs.stdout, logs.stdout
    assert f"[1 {worker.address}]" not in logs.stdout.split(f"job={job_id}.2")[1]
    assert "---- restart 1 of job" in logs.stderr and "node-lost" in logs.stderr

"""Fault drills outside the engine table: AWS going silent under a running cluster.

Its own two-node cluster (real ``dl-executor`` per node with the stack's job role, the
master's real ``dl-controller``) and its own emulated AWS: moto's server in a process of its
own (``tests/support/outage.py``), stopped with SIGSTOP for the outage and resumed with
SIGCONT, as an outage looks to a client: connections complete, nothing answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import boto3
import pytest

from bootstrap_scripts.protocol.paths import NodePaths
from emulator.resources import agent_settings, install_args
from tests.chaos.drills import (
    JOB,
    attempts,
    completions,
    drill,
    leftovers,
    lines_ok,
    record,
    torchelastic_dirs,
    wait_for,
)
from tests.support.cluster import CLUSTER_ID, start_local_cluster
from tests.support.outage import SilentCloud, silent_cloud

pytestmark = pytest.mark.chaos
REGION = "us-east-1"
TRUST = json.dumps({"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
    "Action": ["sts:AssumeRole", "sts:TagSession"]}]})
TERMINAL = ("succeeded", "failed", "cancelled")
RANKS = 2
LINES = 30


@pytest.fixture(scope="module")
def outage_cluster(tmp_path_factory) -> Iterator[tuple]:
    tmp = tmp_path_factory.mktemp("outage")
    with silent_cloud(tmp / "cloud") as cloud:
        iam = boto3.client("iam", endpoint_url=cloud.endpoint, region_name=REGION,
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        arn = iam.create_role(RoleName=f"{CLUSTER_ID}-job",
                              AssumeRolePolicyDocument=TRUST)["Role"]["Arn"]
        c = None
        try:
            c = start_local_cluster(tmp / "cluster", RANKS)
            for node in c.nodes:
                settings = agent_settings(node.role, cluster_id=CLUSTER_ID,
                                          mount_point=str(c.efs))
                node.install(install_args({**settings, "job-role-arn": arn}))
                node.env.update({"AWS_ENDPOINT_URL": cloud.endpoint,
                                 "AWS_ACCESS_KEY_ID": "NODEKEY",
                                 "AWS_SECRET_ACCESS_KEY": "node-secret",
                                 "AWS_SESSION_TOKEN": "node-token"})
            c.start_executors()
            # the controller as the engine drills run it, without AWS: its own calls (the
            # job's pricing) are not what this drill is about
            master = c.node(c.membership.master_addr)
            master.env = {k: v for k, v in master.env.items() if not k.startswith("AWS_")}
            c.start_controller()
            yield c, cloud
        finally:
            left: set[int] = set()
            if c is not None:
                c.stop()
                left = c.leftovers()
            assert not left, f"processes left behind: {sorted(left)}"


def submit(c, *args: str) -> str:
    res = c.run("--detach", "--json", "--launcher", "each", "--", "python", JOB, *args,
                managed=True, timeout=60)
    assert res.returncode == 0, res.stdout
    return json.loads(res.stdout.strip().splitlines()[-1])["job_id"]


def ended(c, job_id: str) -> bool:
    rec = record(c.efs, job_id)
    return rec is not None and rec.state in TERMINAL


def test_aws_outage_at_a_jobs_start_is_named_and_blames_no_node(outage_cluster):
    """(47.3) moto stopped while a managed job starts: the executors' heartbeats go on, the
    attempt fails as an AWS outage (infrastructure), no node is lost or marked, and once AWS
    answers again the job runs to its end."""
    c, cloud = outage_cluster
    assert isinstance(cloud, SilentCloud)
    with drill("AWS outage at a job's start", "moto SIGSTOPped while a managed job's shares "
               "wait for their job role credentials, SIGCONT after the attempt ended") as row:
        elastic = torchelastic_dirs()
        cloud.silence()
        t0 = time.monotonic()
        try:
            job_id = submit(c, "--lines", str(LINES))
            wait_for("the first attempt to end", lambda: (r := record(c.efs, job_id))
                     and (r.restart_log or r.state in TERMINAL), 180)
        finally:
            cloud.resume()
        wait_for("attempt 2 to start", lambda: len(attempts(c.efs, job_id)) >= 2
                 or ended(c, job_id), 120)
        row.seconds = time.monotonic() - t0
        rec = wait_for(f"job {job_id} to end: {c.controller_log()[-1500:]}",
                       lambda: (r := record(c.efs, job_id)) and r.state in TERMINAL and r, 240)
        first = rec.restart_log[0] if rec.restart_log else None
        row.did = (f"{rec.state}; " + ", ".join(f"{r.kind}@{r.attempt}: {r.detail[:60]}"
                                                 for r in rec.restart_log))[:300]
        row.check("record", rec.state == "succeeded" and first is not None
                  and "AWS did not answer" in first.detail, row.did)
        row.check("no node lost", all(r.kind != "node-lost" for r in rec.restart_log)
                  and "heartbeat stopped" not in rec.to_json(), row.did)
        row.check("no node marked", not any(r.marked_unhealthy or r.replacement_instance_id
                                            for r in rec.restart_log), row.did)
        row.check("once", completions(c.efs, job_id, RANKS) == 1)
        ok, detail = lines_ok(c.efs, job_id, RANKS, LINES, reattached=False)
        row.check("lines", ok, detail)
        left = leftovers(c.efs, job_id, c.roots,
                         lambda root: NodePaths(root).share_status_dir, elastic)
        row.check("nothing left", not left, "; ".join(left[:4]))

"""Fault drills outside the engine table: AWS going silent, an output burst, a cancel while
a job restarts.

Their own two-node cluster (real ``dl-executor`` per node with the stack's job role, the
master's real ``dl-controller``; EFS a plain directory, room for a burst) and their own
emulated AWS: moto's server in a process of its own (``tests/support/outage.py``), stopped
with SIGSTOP for the outage and resumed with SIGCONT, as an outage looks to a client:
connections complete, nothing answers. Each drill leaves the cluster idle for the next.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.jobs.executor import log_mirror
from bootstrap_scripts.protocol.paths import JobPaths, NodePaths
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


# -- an output burst -----------------------------------------------------------------------

BURST_MIB = 300
BURST_LINES = BURST_MIB * 1024  # of 1010 bytes each
BURST = ("import sys\nline = b'x' * 1000 + b'\\n'\nout = sys.stdout.buffer\n"
         f"for k in range({BURST_LINES}):\n    out.write(b'%08d ' % k + line)\n")


#: the most of one share's log the executor copies locally (``log_mirror``)
COPY_CAP = 256 * 1024 * 1024


def copy_ended(root: Path) -> bool:
    """The node's copy of the burst ended: its last line, or the line saying the rest was
    not copied (read from the file's end: it is hundreds of MiB)."""
    path = log_mirror.jobs_log(root)
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 4096))
            tail = f.read()
    except OSError:
        return False
    return b"not copied here" in tail or b" %08d " % (BURST_LINES - 1) in tail


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (``VmHWM``), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def test_an_output_burst_leaves_the_root_executor_small(outage_cluster):
    """(47.5) each rank prints 300 MiB as fast as it can and exits: the root executor's peak
    memory grows by a few MiB at most, its local copy (jobs.log) is capped, every line is on
    EFS."""
    c, _cloud = outage_cluster
    with drill("output burst", f"{BURST_MIB} MiB printed by each rank at once, then exit"
               ) as row:
        before = {a: peak_rss_kib(p.pid) for a, p in c.executors.items()}
        t0 = time.monotonic()
        res = c.run("--launcher", "each", "--", "python3", "-c", BURST, timeout=600)
        job_dir = max(c.job_dirs(), key=lambda d: d.stat().st_mtime)
        paths = JobPaths(job_dir)
        wait_for("the copies to end", lambda: all(copy_ended(root)
                                                   for root in c.roots.values()), 300)
        row.seconds = time.monotonic() - t0
        grown = {a: (peak_rss_kib(p.pid) - before[a]) // 1024 for a, p in c.executors.items()}
        copies = {a: sum(f.stat().st_size for f in log_mirror.jobs_log(root).parent.glob(
            "jobs.log*")) // (1024 * 1024) for a, root in c.roots.items()}
        row.did = (f"dl-run exit {res.returncode}; executors' peak memory grew "
                   f"{sorted(grown.values())} MiB; local copies {sorted(copies.values())} MiB")
        row.check("job succeeded", res.returncode == 0, res.stdout[-300:])
        row.check("executor memory bounded", all(g < 64 for g in grown.values()), row.did)
        # the cap counts the share's bytes (the chunk that crosses it included); each copied
        # line also carries its prefix (~5 % of these 1 KB lines)
        cap = COPY_CAP * 1.1 // (1024 * 1024)
        row.check("local copy capped", all(m <= cap for m in copies.values()), row.did)
        on_efs = [paths.log(r).stat().st_size for r in range(RANKS)]
        row.check("all of it on EFS", all(b == BURST_LINES * 1010 for b in on_efs),
                  f"{on_efs} bytes")

"""Fault drills with the health gate on: a cancel while a job restarts, network partitions.

Their own two-node cluster (``tests.support.cluster``: real ``dl-executor`` per node, the
master's real ``dl-controller`` with the real health gate before every attempt: its node
checks and its all-reduce as real jobs through the executors; DescribeInstanceTypes from the
session's moto). Each node's job connections leave from its own address
(``DEEPLEARNING_NODE_CONNECT=1``, ``tests/support/partition.py``), so a partition is the
kernel dropping one node's packets to another. Each drill leaves the cluster idle for the
next, every rule deleted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from tests.chaos.drills import attempts, drill, leftovers, record, torchelastic_dirs, wait_for
from tests.conftest import REGION
from tests.support import partition
from tests.support.cluster import start_local_cluster

pytestmark = pytest.mark.chaos
TERMINAL = ("succeeded", "failed", "cancelled")
RANKS = 2
#: attempt 1 exits 3 (a code failure, restarted under --max-code-restarts), later ones 0
FAIL_FIRST = ("import os, sys, time; time.sleep(1); "
              "sys.exit(3 if os.environ.get('DL_RESTART_COUNT', '0') == '0' else 0)")


@pytest.fixture(scope="module")
def gated_cluster(tmp_path_factory, moto_endpoint) -> Iterator:
    why = partition.why_not()
    assert not why, f"a partition cannot be made here: {why}"
    c = None
    try:
        c = start_local_cluster(tmp_path_factory.mktemp("gated"), RANKS)
        for node in c.nodes:  # job connections leave from the node's own address
            node.env["DEEPLEARNING_NODE_CONNECT"] = "1"
        c.start_executors()
        c.start_controller({"AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": REGION,
                            "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
                            "AWS_SECRET_ACCESS_KEY": "testing"}, health_gate=True)
        yield c
    finally:
        left: set[int] = set()
        if c is not None:
            c.stop()
            left = c.leftovers()
        assert not left, f"processes left behind: {sorted(left)}"


def submit(c, *args: str) -> str:
    res = c.run("--detach", "--json", *args, managed=True, timeout=60)
    assert res.returncode == 0, res.stdout
    return json.loads(res.stdout.strip().splitlines()[-1])["job_id"]


def gate_jobs(c) -> set[str]:
    """The names of every health-gate job directory there is (``health-checks-…``)."""
    return {d.name for d in c.job_dirs() if d.name.startswith("health-")}


def test_a_cancel_while_restarting_is_final(gated_cluster):
    """(47.6) ``dl-jobs cancel`` while the job is ``restarting`` (attempt 1's code failure,
    the health gate running for attempt 2): no further attempt starts, the record ends
    ``cancelled``, nothing of the job is left running."""
    c = gated_cluster
    with drill("cancel while restarting", "dl-jobs cancel while the health gate runs "
               "before attempt 2 (attempt 1 exited 3, one code restart allowed)") as row:
        elastic = torchelastic_dirs()
        job_id = submit(c, "--launcher", "each", "--max-code-restarts", "1", "--",
                        "python", "-c", FAIL_FIRST)
        wait_for(f"job {job_id} to restart: {c.controller_log()[-1500:]}",
                 lambda: (r := record(c.efs, job_id)) and r.state in ("restarting", *TERMINAL),
                 240)
        before = gate_jobs(c)
        wait_for("the health gate to start for attempt 2", lambda: gate_jobs(c) - before
                 or (r := record(c.efs, job_id)) is None or r.state != "restarting", 120)
        state_then = record(c.efs, job_id).state
        res = c.dl_jobs("cancel", job_id)
        t0 = time.monotonic()
        rec = wait_for(f"job {job_id} to end: {c.controller_log()[-1500:]}",
                       lambda: (r := record(c.efs, job_id)) and r.state in TERMINAL and r, 240)
        row.seconds = time.monotonic() - t0
        ran = attempts(c.efs, job_id)
        row.did = (f"cancelled while {state_then}: {res.stdout.strip()[:90]}; record "
                   f"{rec.state} after attempt {rec.attempt}: {rec.message[:60]}; "
                   f"{len(ran)} attempt dir(s)")
        row.check("cancelled while restarting", state_then == "restarting"
                  and res.returncode == 0, f"{state_then}: {res.stdout} {res.stderr}")
        row.check("record", rec.state == "cancelled" and rec.attempt == 1, row.did)
        row.check("no further attempt", len(ran) == 1 and not ClusterPaths(c.efs).job(
            f"{job_id}.2").dir.exists(), row.did)
        time.sleep(3)  # a late attempt would start right after the gate: look once more
        row.check("still none", len(attempts(c.efs, job_id)) == 1
                  and record(c.efs, job_id).state == "cancelled")
        left = leftovers(c.efs, job_id, c.roots,
                         lambda root: NodePaths(root).share_status_dir, elastic)
        runners = c.attempt_runners()
        row.check("nothing left", not left and not runners,
                  "; ".join(left[:4]) + (f" runners {sorted(runners)}" if runners else ""))

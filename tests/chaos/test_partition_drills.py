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

import contextlib
import json
import pwd
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine import gate_identity
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from tests.chaos.drills import attempts, drill, leftovers, record, torchelastic_dirs, wait_for
from tests.conftest import REGION
from tests.support import partition
from tests.support.cluster import free_rdzv_port, start_local_cluster

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


def owners() -> set[int]:
    """Who this cluster's job processes run as: root (the drills' jobs) and the gate's
    user (``jobs.engine.gate_identity``)."""
    return {0, *(u.pw_uid for u in pwd.getpwall() if u.pw_name == gate_identity.NAME)}


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
                         lambda root: NodePaths(root).share_status_dir, elastic,
                         owners=owners())
        runners = c.attempt_runners()
        row.check("nothing left", not left and not runners,
                  "; ".join(left[:4]) + (f" runners {sorted(runners)}" if runners else ""))


# -- a long master<->worker partition ------------------------------------------------------

LINK_JOB = str(Path(__file__).parent / "jobs" / "node_link_steps.py")
#: how long the link is down (the drill's docstring says why)
PARTITION_SECONDS = 330.0
LINK_STEPS = 60


def top_step(c, job_id: str, attempt: int) -> int:
    """The highest step any rank of ``attempt`` declared (0: none yet)."""
    progress_dir = ClusterPaths(c.efs).job(f"{job_id}.{attempt}").dir / "progress"
    steps = [0]
    for f in progress_dir.glob("*.json") if progress_dir.is_dir() else ():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            steps.append(int(json.loads(f.read_text())["step"] or 0))
    return max(steps)


def moved(c, job_id: str, past: int) -> bool:
    """A rank declared a step past ``past`` in attempt 1, or a later attempt stepped."""
    return top_step(c, job_id, 1) > past or any(
        top_step(c, job_id, a) > 0 for a in range(2, len(attempts(c.efs, job_id)) + 1))


def test_a_long_partition_is_a_visible_stall_never_a_code_failure(gated_cluster):
    """(47.2) master<->worker dropped while a torchrun job trains: while the link is down the
    record's ``stalled`` says so (and ``dl-jobs``); after the heal the job trains on, or its
    attempt is restarted as the network's (kind ``network``), never failed as user code.

    Why 330 s (the issue's 300 s and a little): the stall is shown after 5 minutes without
    progress (``hangs.STALL_SECONDS``); a 60 s partition showed nothing and the job simply
    went on after it, so a shorter one would not drill what the issue saw."""
    c = gated_cluster
    master, worker = c.addresses
    with drill("master<->worker partition", f"both directions between the master and the "
               f"worker dropped for {PARTITION_SECONDS:.0f} s while a torchrun job "
               "all-reduces every step (no --hang-timeout)") as row:
        elastic = torchelastic_dirs()
        job_id = submit(c, "--rdzv-port", free_rdzv_port(c), "--max-restarts", "2", "--",
                        "python", LINK_JOB, "--steps", str(LINK_STEPS))
        wait_for(f"job {job_id} to make progress: {c.controller_log()[-1500:]}",
                 lambda: top_step(c, job_id, 1) >= 3, 240)
        stalled, listed = "", ""
        with partition.partitioned(master, worker):
            t0 = time.monotonic()
            cut_at = top_step(c, job_id, 1)
            while time.monotonic() < t0 + PARTITION_SECONDS:
                rec = record(c.efs, job_id)
                if rec is not None and rec.stalled and not stalled:
                    stalled = rec.stalled
                    listed = c.dl_jobs("list").stdout
                time.sleep(2)
            at_heal = (record(c.efs, job_id).state, top_step(c, job_id, 1))
        healed = time.monotonic()
        wait_for(f"job {job_id} to move again: {c.controller_log()[-2000:]}",
                 lambda: moved(c, job_id, at_heal[1])
                 or ((r := record(c.efs, job_id)) and r.state in TERMINAL), 600)
        row.seconds = time.monotonic() - healed
        rec = wait_for(f"job {job_id} to end: {c.controller_log()[-2000:]}",
                       lambda: (r := record(c.efs, job_id)) and r.state in TERMINAL and r, 600)
        ran = attempts(c.efs, job_id)
        row.did = (f"while cut: {stalled or 'no stall shown'}; at the heal {at_heal[0]} at "
                   f"step {at_heal[1]} (step {cut_at} when cut); restarts: " + (", ".join(
                       f"{r.kind}@{r.attempt}: {r.detail[:80]}" for r in rec.restart_log)
                       or "none") + f"; {rec.state} after {len(ran)} attempt(s)")[:400]
        row.check("stall visible", bool(stalled) and "stalled" in listed, row.did)
        row.check("never user code", all(r.kind == "network" for r in rec.restart_log)
                  and "user-code" not in rec.message, row.did)
        row.check("record", rec.state == "succeeded", row.did)
        row.check("trained to the end", top_step(c, job_id, len(ran)) == LINK_STEPS,
                  f"last attempt at step {top_step(c, job_id, len(ran))}")
        left = leftovers(c.efs, job_id, c.roots,
                         lambda root: NodePaths(root).share_status_dir, elastic,
                         owners=owners())
        row.check("nothing left", not left, "; ".join(left[:4]))

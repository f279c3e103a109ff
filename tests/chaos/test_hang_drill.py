"""Fault drill: one rank of a real torchrun job (CPU, gloo, two nodes) stops making progress.

On the shared cluster of ``conftest.py`` (real executors, the real ``dl-controller``): a
managed job with ``--hang-timeout`` whose rank ``--hang-rank`` sleeps forever at step
``--hang-at`` of its first attempt (``jobs/hang_at_step.py``), while its peer waits in the
next all-reduce. The controller must judge the hang from the ranks' progress files, dump
both ranks' stacks with py-spy as root on their nodes, name the sleeping rank and its
node, stop the attempt and restart it (kind ``hang``); the restarted attempt completes.
The figure printed (never asserted): seconds from the last progress to the detection.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import HangReport
from bootstrap_scripts.protocol.paths import SHARE_STARTED_SUFFIX, ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import ShareStarted
from tests.chaos.drills import attempts, drill, leftovers, record, torchelastic_dirs, wait_for
from tests.support.cluster import free_rdzv_port

pytestmark = pytest.mark.chaos
JOB = str(Path(__file__).parent / "jobs" / "hang_at_step.py")
HANG_TIMEOUT = 5.0
TERMINAL = ("succeeded", "failed", "cancelled")


def hung_node(efs: Path, job_id: str) -> str:
    """The address of the node whose log says its rank started hanging (attempt 1)."""
    first = attempts(efs, job_id)[0]
    for _stem, rec in store.scan_records(first.nodes, ShareStarted, suffix=SHARE_STARTED_SUFFIX):
        if "hanging rank=" in (store.read_text(first.log(rec.rank)) or ""):
            return rec.address
    return ""


def test_l_a_rank_hangs(chaos_cluster):
    c = chaos_cluster
    with drill("(l) a rank hangs", "torchrun rank 1 of 2 sleeps forever at step 10 (its "
               "peer waits in the all-reduce)") as row:
        elastic = torchelastic_dirs()
        res = c.run("--detach", "--json", "--rdzv-port", free_rdzv_port(c), "--hang-timeout",
                    f"{HANG_TIMEOUT:g}", "--max-restarts", "1", "--", "python", JOB,
                    "--hang-at", "10", "--hang-rank", "1", "--steps", "30", managed=True,
                    timeout=60)
        assert res.returncode == 0, res.stdout
        job_id = json.loads(res.stdout.strip().splitlines()[-1])["job_id"]
        rec = wait_for(f"job {job_id} to end: {c.controller_log()[-3000:]}",
                       lambda: (r := record(c.efs, job_id)) and r.state in TERMINAL and r, 300)
        report_path = ClusterPaths(c.efs).managed(job_id).attempt_hang(1)
        rep = store.read_record_or_none(report_path, HangReport)
        assert rep is not None, f"no hang report: {c.controller_log()[-3000:]}"
        detection = rep.detected_at - rep.last_progress_at
        resumed = rec.restart_log[0].seconds_to_resume if rec.restart_log else None
        row.seconds = detection + (resumed or 0.0)
        hanging = hung_node(c.efs, job_id)
        by_rank = {x.rank: x for x in rep.ranks}
        row.did = (f"{rec.state}, restarts {[r.kind for r in rec.restart_log]}; last progress "
                   f"-> detection {detection:.1f} s (--hang-timeout {HANG_TIMEOUT:g}); odd "
                   f"rank(s) {list(rep.odd_ranks)} on {list(rep.odd_addresses)}")
        print(f"\nhang drill: last progress -> detection {detection:.2f} s, detection -> "
              f"running again {resumed} s (--hang-timeout {HANG_TIMEOUT:g})")
        row.check("record", rec.state == "succeeded" and [r.kind for r in rec.restart_log]
                  == ["hang"] and "rank(s) 1" in rec.restart_log[0].detail,
                  f"{rec.state}: {rec.message}; restarts: {rec.last_failure}")
        row.check("stacks", set(by_rank) == {0, 1} and "hang_here" in by_rank[1].stack
                  and "all_reduce" in by_rank[0].stack and not by_rank[1].error,
                  "; ".join(f"{r}: {x.error or x.signature[:80]}" for r, x in by_rank.items()))
        row.check("named", rep.odd_ranks == (1,) and rep.odd_addresses == (hanging,)
                  and rec.restart_log[0].address == hanging,
                  f"odd {rep.odd_ranks} {rep.odd_addresses}, the hung node {hanging}")
        row.check("detected after the timeout", detection >= HANG_TIMEOUT,
                  f"{detection:.1f} s")
        done = [store.read_text(attempts(c.efs, job_id)[-1].log(r)) or "" for r in (0, 1)]
        row.check("once", sum(t.count("COMPLETE rank=") for t in done) == 2,
                  "the restarted attempt completed on both ranks")
        left = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            left = leftovers(c.efs, job_id, c.roots,
                             lambda root: NodePaths(root).share_status_dir, elastic)
            if not left:
                break
            time.sleep(0.2)
        row.check("nothing left", not left, "; ".join(left[:4]))

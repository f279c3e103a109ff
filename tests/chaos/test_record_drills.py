"""Fault drills: records no reader expects, left where the root daemons read, on the shared
emulated cluster (conftest). After each fault the executors and the controller are still
running and a job submitted after it completes exactly once.

- a crash-looping record: a job spec that is a JSON array, one nested 100,000 deep, and a
  managed job's ``job.json`` and ``request.json`` nested 100,000 deep (before, every
  executor and the controller died at each start on them);
- a FIFO in a record's place: a job's checkpoint ``latest.json`` left as a FIFO by the job
  itself before the controller restarts it (before, the controller waited in ``open()`` for
  good), and FIFOs with a writer as a job's spec and a managed job's record.
"""

from __future__ import annotations

import json
import time

import pytest

from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.chaos.drills import JOB, attempts, completions, drill, record, wait_for
from tests.support import hostile_files as hostile

pytestmark = pytest.mark.chaos
TERMINAL = ("succeeded", "failed", "cancelled")
RANKS = 2


def submit(c, *args: str) -> str:
    res = c.run("--detach", "--json", *args, managed=True, timeout=60)
    assert res.returncode == 0, res.stdout
    return json.loads(res.stdout.strip().splitlines()[-1])["job_id"]


def finished(c, job_id: str, timeout: float = 180):
    return wait_for(f"job {job_id} to end: {c.controller_log()[-2000:]}",
                    lambda: (r := record(c.efs, job_id)) and r.state in TERMINAL and r, timeout)


def daemons_alive(c) -> bool:
    return all(p.poll() is None for p in c.executors.values()) and \
        c.controller is not None and c.controller.poll() is None


def another_job_completes(c, row) -> None:
    """A job submitted after the fault runs to its end, once, with the daemons up."""
    job_id = submit(c, "--launcher", "each", "--", "python", JOB, "--lines", "5")
    rec = finished(c, job_id)
    row.check("record", rec.state == "succeeded", rec.message)
    row.check("once", completions(c.efs, job_id, RANKS) == 1, "completed more or less")
    row.check("daemons up", daemons_alive(c))


def test_r1_crash_looping_records(chaos_cluster):
    c = chaos_cluster
    with drill("(r1) crash-looping records", "a spec '[]', a spec and a job.json and a "
               "request.json nested 100,000 deep") as row:
        paths = ClusterPaths(c.efs)
        t0 = time.monotonic()
        hostile.write(paths.job("evil-list").spec, "[]")
        hostile.write(paths.job("evil-deep").spec, hostile.deep_json())
        hostile.write(paths.managed("evil-record").record, hostile.deep_json(opener="{"))
        hostile.write(paths.managed("evil-request").request, hostile.deep_json())
        another_job_completes(c, row)
        row.seconds = time.monotonic() - t0
        refused = [k for k in ("evil-list", "evil-deep")
                   if all(k in c.executor_log(a) for a in c.addresses)]
        row.did = (f"specs refused on every node: {', '.join(refused) or 'none'}; "
                   f"evil-request: {getattr(record(c.efs, 'evil-request'), 'state', '-')}")
        row.check("refused", len(refused) == 2, "the executors' logs name no refusal")
        for key in ("evil-list", "evil-deep"):
            hostile.clear(paths.job(key).dir)  # the shared cluster left as it was
        for key in ("evil-record", "evil-request"):
            hostile.clear(paths.managed(key).dir)


#: the job: a FIFO as its checkpoint's latest.json, then a failure the controller restarts
FIFO_JOB = ("import os; d = os.environ['DL_CHECKPOINT_DIR']; os.makedirs(d, exist_ok=True); "
            "p = os.path.join(d, 'latest.json'); os.path.exists(p) or os.mkfifo(p); "
            "raise SystemExit(3)")


def test_r2_a_fifo_in_a_records_place(chaos_cluster):
    c = chaos_cluster
    with drill("(r2) FIFO as a record", "a job leaves a FIFO as its latest.json before its "
               "restart; FIFOs with a writer as a spec and a job.json") as row:
        paths = ClusterPaths(c.efs)
        undo = [hostile.plant(paths.job("evil-fifo-spec").spec, "fifo-with-writer"),
                hostile.plant(paths.managed("evil-fifo-record").record, "fifo-with-writer")]
        try:
            t0 = time.monotonic()
            fifo_job = submit(c, "--max-code-restarts", "1", "--launcher", "each", "--",
                              "python", "-c", FIFO_JOB)
            rec = finished(c, fifo_job)
            row.check("restarted", rec.attempt == 2 and rec.state == "failed",
                      f"{rec.state} after attempt {rec.attempt}")
            another_job_completes(c, row)
            row.seconds = time.monotonic() - t0
            row.did = (f"FIFO job {rec.state} after {rec.attempt} attempts "
                       f"({len(attempts(c.efs, fifo_job))} run); another job succeeded")
        finally:
            for u in undo:
                u()
            for planted in (paths.job("evil-fifo-spec"), paths.managed("evil-fifo-record")):
                hostile.clear(planted.dir)  # the shared cluster left as it was

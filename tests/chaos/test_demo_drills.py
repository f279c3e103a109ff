"""The demo's recovery drills as table rows: the whole emulated AWS deployment
(``python -m emulator.demo``: moto, the CDK deploy, one emulated node per instance with its
agent, executor and controller) training the example job while a node fails.

Two demo runs: a worker with a failing GPU driver plus a worker killed mid-training
(``--unhealthy-node --kill-node-after``, rows (i) and (k)), and the master killed
mid-training (``--kill-master-after``, row (j)). What the rows say is read from the demo's
report: the controller's own job record (``dl-jobs show --json``), the emulated Auto
Scaling's actions, the epochs the job printed. Emulated delays: EC2's status check and
Auto Scaling's replacement are the emulator's (docs/emulator.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import alive, pids_in_groups
from tests.chaos.drills import assert_passed, drill, torchelastic_dirs
from tests.support.demo import kill_everything, recorded_groups, run_demo

pytestmark = pytest.mark.chaos
EPOCHS = 12
TIMEOUT = 600


def epochs_ok(epochs: list[dict]) -> tuple[bool, str]:
    """Every epoch 1..EPOCHS reported; the last attempt's a run to the end from its resume
    point (a resumed attempt repeats at most the epoch it was killed in)."""
    seen = sorted({e["epoch"] for e in epochs})
    last_attempt = max((e["attempt"] for e in epochs), default=0)
    last = [e["epoch"] for e in epochs if e["attempt"] == last_attempt]
    ok = seen == list(range(1, EPOCHS + 1)) and bool(last) and \
        last == list(range(last[0], EPOCHS + 1))
    return ok, f"epochs {seen[:1]}..{seen[-1:]}, last attempt {last[:1]}..{last[-1:]}"


def left_behind(tmp_path: Path, report: dict, elastic: set[str]) -> list[str]:
    """Live processes of the demo's groups or of its jobs, and new ``/tmp/torchelastic_*``."""
    new = sorted(torchelastic_dirs() - elastic)
    groups = recorded_groups(tmp_path)
    left = pids_in_groups(groups) | {g for g in groups if alive(g)}
    if left:
        kill_everything(tmp_path)
    stopped = [p for p in report.get("stopped_pids") or [] if alive(p)]
    return ([f"pids {sorted(left)}"] if left else []) + \
        ([f"stopped pids alive {stopped}"] if stopped else []) + \
        ([f"demo leftovers {report.get('leftover_pids')}"] if report.get("leftover_pids")
         else []) + [f"new {d}" for d in new]


def actions(report: dict, what: str) -> list[str]:
    return [e["instance_id"] for e in report.get("autoscaling", []) if e["what"] == what]


def test_i_k_lost_worker_and_unhealthy_worker(tmp_path: Path):
    elastic = torchelastic_dirs()
    code, out, report = run_demo(tmp_path, "--workers", "2", "--unhealthy-node",
                                 "--kill-node-after", "1", "--epochs", str(EPOCHS),
                                 "--require-acc", "0.85", timeout=TIMEOUT)
    rec = report.get("recovery", {})
    jobs = report.get("jobs") or [{}]
    job = jobs[0]
    left = left_behind(tmp_path, report, elastic)
    with drill("(k) unhealthy worker", "a worker whose GPU driver fails (nvidia-smi errors) "
               "from boot (time: from the demo's start)", defer=True) as sick_row:
        row = sick_row
        assert code == 0, out[-3000:]
        sick = rec["unhealthy"]
        row.seconds = sick.get("replaced_s")
        row.did = (f"health gate failed it, marked Unhealthy, replaced by Auto Scaling "
                   f"before the job trained; job {job.get('state')}")
        row.check("record", sick["instance_id"] in actions(report, "unhealthy-terminated")
                  and job.get("epochs") and sick["replaced_s"] < job["epochs"][0]["seen"])
        row.check("nothing left", not left, "; ".join(left))
    with drill("(i) worker kill", "kill -9 of every process of a worker (the machine gone) "
               "1 s into training", defer=True) as row:
        assert code == 0, out[-3000:]
        kill = rec["kill_node"]
        restart = kill.get("restart", {})
        row.seconds = kill.get("training_again_s")
        row.did = (f"{job.get('state')}: {restart.get('kind')} restart, node marked Unhealthy "
                   f"and replaced, resumed at epoch {restart.get('resumed_epoch')} on "
                   f"{restart.get('next_world_size')} nodes")
        row.check("record", job.get("state") == "succeeded"
                  and restart.get("kind") in ("node-lost", "node-signal")
                  and restart.get("marked_unhealthy") and restart.get("next_world_size") == 3,
                  str(restart))
        row.check("once", [e["epoch"] for e in job.get("epochs", [])].count(EPOCHS) == 1)
        ok, detail = epochs_ok(job.get("epochs", []))
        row.check("epochs", ok, detail)
        row.check("nothing left", not left, "; ".join(left))
    assert_passed(sick_row, row)


def test_j_lost_master(tmp_path: Path):
    elastic = torchelastic_dirs()
    code, out, report = run_demo(tmp_path, "--workers", "1", "--kill-master-after", "1",
                                 "--epochs", str(EPOCHS), "--require-acc", "0.85",
                                 timeout=TIMEOUT)
    left = left_behind(tmp_path, report, elastic)
    with drill("(j) master kill", "kill -9 of every process of the master (the machine "
               "gone) 1 s into training") as row:
        assert code == 0, out[-3000:]
        kill = report["recovery"]["kill_master"]
        first, attached = report["jobs"]
        (restart,) = [r for r in attached["restarts"] if r["kind"] == "master-lost"]
        row.seconds = kill.get("training_again_s") or kill.get("resumed_s")
        row.did = (f"status check failed it, replaced; new master took over (generation "
                   f"{kill['generation']}); {attached['state']} after a master-lost restart "
                   f"from epoch {restart.get('resumed_epoch')}")
        row.check("record", attached["state"] == "succeeded"
                  and attached["managed_id"] == first["managed_id"]
                  and actions(report, "status-check-failed") == [kill["instance_id"]]
                  and [s["Status"] for s in report["wait_condition"]] == ["SUCCESS"])
        epochs = first.get("epochs", []) + attached.get("epochs", [])
        row.check("once", [e["epoch"] for e in epochs].count(EPOCHS) == 1)
        ok, detail = epochs_ok(attached.get("epochs", []))
        row.check("epochs", ok, detail)
        row.check("nothing left", not left, "; ".join(left))

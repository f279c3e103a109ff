"""``make demo`` recovery drills: managed jobs heal themselves, nobody re-runs them.

Two demo runs (CI time): one where a worker with a failing GPU driver is replaced before the
job starts and another worker dies mid-training (``--unhealthy-node --kill-node-after``),
one where the master dies mid-training (``--kill-master-after``). Each asserts on the
report (the job controller's own record of the job, read with ``dl-jobs show ID --json``,
and the emulated Auto Scaling's actions), on the files on EFS, and that nothing is left.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.conftest import REPO_ROOT
from tests.support.demo import assert_nothing_left, demo_env, run_demo

TIMEOUT = 600


def actions(report: dict, what: str) -> list[str]:
    """Instance ids the emulated Auto Scaling / EC2 did ``what`` to, in order."""
    return [e["instance_id"] for e in report["autoscaling"] if e["what"] == what]


@pytest.mark.slow
def test_unhealthy_worker_replaced_then_lost_worker_healed(tmp_path: Path):
    code, out, report = run_demo(tmp_path, "--workers", "2", "--unhealthy-node",
                                 "--kill-node-after", "1", "--epochs", "12",
                                 "--require-acc", "0.85", timeout=TIMEOUT)
    assert code == 0, out[-6000:]
    rec = report["recovery"]
    sick, kill = rec["unhealthy"], rec["kill_node"]
    assert sick["instance_id"] != kill["instance_id"]
    # the failing check is named (from the controller's gate_failures, which the later
    # node-lost restart does not overwrite), on the console and in the report
    assert sick["gate_failure"].startswith("nvidia-smi: "), sick
    assert f"failed the health gate ({sick['gate_failure']})" in out
    # one dl-run, one managed job, from the first epoch to the last
    (job,) = report["jobs"]
    assert job["exit_code"] == 0 and job["state"] == "succeeded" and job["how"] == "dl-run"
    assert job["epochs"][-1]["epoch"] == 12 and job["final_acc"] >= 0.85
    assert job["world_size"] == 3
    # the controller's own record of the restart after the kill
    (restart,) = [r for r in job["restarts"] if r["address"] == kill["address"]]
    assert restart["kind"] == "node-lost", restart  # a job's exit signal never blames a node
    assert restart["instance_id"] == kill["instance_id"], restart
    assert restart["marked_unhealthy"] and restart["replacement_instance_id"]
    assert restart["next_world_size"] == 3
    assert restart["resumed_epoch"] is not None and restart["resumed_epoch"] >= 1
    resumed = [e for e in job["epochs"] if e["attempt"] > 1]
    assert resumed and resumed[0]["epoch"] > 1 and resumed[0]["world_size"] == 3
    assert kill["detected_s"] > 0 and kill["training_again_s"] > kill["detected_s"]
    # Auto Scaling replaced both (the unhealthy one before the job trained), nobody else
    terminated = actions(report, "unhealthy-terminated")
    assert sick["instance_id"] in terminated and kill["instance_id"] in terminated
    assert sick["instance_id"] not in actions(report, "status-check-failed")
    assert len(actions(report, "node-booted")) == 2
    assert sick["replaced_s"] < job["epochs"][0]["seen"]
    # the membership: three nodes again, neither replaced instance in it (moto may hand a
    # freed address to the replacement, so instances are compared, not addresses)
    m = Membership.load(ClusterPaths(tmp_path / "work" / "efs").membership)
    members = [n.instance_id for n in m.nodes]
    assert len(members) == 3 and len(report["membership"]["nodes"]) == 3
    assert sick["instance_id"] not in members and kill["instance_id"] not in members
    killed = [n for n in report["nodes"] if n["status"] == "killed"]
    assert [n["instance_id"] for n in killed] == [kill["instance_id"]]
    assert report["wait_condition"][0]["Status"] == "SUCCESS"
    assert len(report["wait_condition"]) == 1
    assert_nothing_left(tmp_path, report)


@pytest.mark.slow
def test_lost_master_replaced_taken_over_and_the_job_finishes(tmp_path: Path):
    code, out, report = run_demo(tmp_path, "--workers", "1", "--kill-master-after", "1",
                                 "--epochs", "12", "--require-acc", "0.85", timeout=TIMEOUT)
    assert code == 0, out[-6000:]
    kill = report["recovery"]["kill_master"]
    first, attached = report["jobs"]
    # dl-run died with the master; the user's re-attach on the new one saw the job through
    assert first["how"] == "dl-run" and first["exit_code"] != 0
    assert attached["how"] == "dl-jobs logs -f" and attached["exit_code"] == 0
    assert attached["managed_id"] == first["managed_id"] == attached["job_id"]
    assert attached["state"] == "succeeded" and attached["final_acc"] >= 0.85
    assert attached["epochs"][-1]["epoch"] == 12 and attached["world_size"] == 2
    (restart,) = [r for r in attached["restarts"] if r["kind"] == "master-lost"]
    assert restart["resumed_epoch"] is not None
    # nobody reported the lost master: EC2's status check did, Auto Scaling replaced it
    assert actions(report, "status-check-failed") == [kill["instance_id"]]
    assert actions(report, "unhealthy-terminated") == [kill["instance_id"]]
    assert kill["replaced_by"] in actions(report, "node-booted")
    # the new master took the cluster over: generation numbers continue, no second signal
    efs = tmp_path / "work" / "efs"
    m = Membership.load(ClusterPaths(efs).membership)
    assert m.master.instance_id == kill["replaced_by"]
    assert kill["generation"] >= 2 and m.generation >= kill["generation"]
    assert Membership.load(ClusterPaths(efs).generation(kill["generation"])).reason == \
        "took-over"
    assert [s["Status"] for s in report["wait_condition"]] == ["SUCCESS"]
    log = ClusterPaths(efs).agent_log(kill["replaced_by"]).read_text()
    assert "event=take-over" in log and "no wait-condition signal" in log
    assert kill["took_over_s"] > 0 and kill["detected_s"] > 0
    assert_nothing_left(tmp_path, report)


@pytest.mark.parametrize(("args", "says"), [
    (("--kill-node-after", "1", "--kill-master-after", "1"), "separate drills; pick one"),
    (("--kill-master-after", "-1"), "--kill-master-after must be >= 0 seconds, got -1.0"),
    (("--kill-master-after", "1", "--epochs", "1"), "--kill-master-after needs --epochs >= 2"),
    (("--unhealthy-node", "--elastic"), "are separate scenarios; pick one"),
])
def test_drills_the_demo_cannot_play_are_refused_before_anything_starts(tmp_path, args, says):
    res = subprocess.run([sys.executable, "-m", "emulator.demo", *args, "--work-dir",
                          str(tmp_path / "work")], cwd=REPO_ROOT, env=demo_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert says in res.stderr
    assert not (tmp_path / "work").exists()

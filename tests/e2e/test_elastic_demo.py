"""``make demo ARGS="--elastic ..."``: workers join and leave a running job through the real
cloud path (moto with the emulator's lifecycle hooks, the Lambda handler, the agents'
generations and drains, the executors), and a scenario that cannot happen while the job
trains fails saying why instead of reporting success."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from emulator.demo import scenarios
from emulator.demo.context import DemoError
from emulator.demo.joblog import JobRun
from tests.conftest import REPO_ROOT
from tests.support.demo import assert_nothing_left, demo_env, run_demo

LOG_RE = re.compile(r"^(\d+) (ADDED|REMOVED) (\S+) (\S+)$")
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
TERMINATE = "autoscaling:EC2_INSTANCE_TERMINATE"


@pytest.mark.slow
def test_worker_added_then_drained_while_training(tmp_path: Path):
    # No --epochs: the demo sizes the job so that both happen while it trains.
    code, out, report = run_demo(tmp_path, "--elastic", "--add-worker-after", "2",
                                 "--remove-worker-after", "5", "--require-acc", "0.95",
                                 timeout=720)
    assert code == 0, out
    el = report["elastic"]
    # The scenario really happened: the world grew, then shrank, during the one job.
    assert el["world_sizes"] == [3, 4, 3], el
    join, drain = el["join"], el["drain"]
    assert join["how"] == "dl-scale --workers" and drain["how"] == "dl-scale --remove"
    assert join["world_size"] == 4 and el["join_latency_s"] > 0
    assert el["drain_latency_s"] > 0
    # Each step of the drain, none of them played by the harness, in the order the product's
    # own records time them: the master's drain record, the executor's .done, the completed
    # lifecycle action; then Auto Scaling terminated the instance.
    assert drain["requested_s"] <= drain["done_s"] <= drain["completed_s"], drain
    assert (drain["reason"], drain["outcome"]) == ("done", "completed")
    assert drain["terminated_s"] is not None
    notes = [(n["events"], n["instances"], n["outcomes"]) for n in report["notifications"]]
    hook = ([TERMINATING], [join["instance_id"]], ["drain-request"])
    gone = [k for k, (e, i, _o) in enumerate(notes) if e == [TERMINATE]
            and i == [join["instance_id"]]]
    assert hook in notes and gone and notes.index(hook) < gone[0], notes
    worker_group = report["stack"]["groups"]["worker"]
    assert join["instance_id"] not in worker_group["instances"]
    assert worker_group["desired"] == 2
    assert report["final_acc"] >= 0.95
    assert len(report["jobs"]) == 1 and report["jobs"][0]["epochs"][-1]["world_size"] == 3
    steps = [s["step"] for s in el["restarts"]]
    assert steps == sorted(steps), f"a restart went back in training: {steps}"
    # membership.log: the base nodes, then the added node ADDED and REMOVED
    lines = [LOG_RE.match(x) for x in el["membership_log"]]
    assert all(lines), el["membership_log"]
    seqs = [int(m.group(1)) for m in lines]
    assert seqs == sorted(seqs)
    changes = [(m.group(2), m.group(3)) for m in lines]
    assert ("ADDED", join["address"]) in changes and ("REMOVED", join["address"]) in changes
    assert changes.index(("ADDED", join["address"])) < changes.index(("REMOVED", join["address"]))
    # every remaining node's workers file follows the live membership; the removed one is
    # stopped because EC2 terminated its instance
    work = tmp_path / "work"
    nodes = {n["instance_id"]: n for n in report["nodes"]}
    assert nodes[join["instance_id"]]["status"] == "removed"
    want = report["membership"]["nodes"]
    assert want and join["address"] not in want
    for n in nodes.values():
        if n["status"] != "removed" and n["address"]:
            assert NodePaths(n["root"]).workers.read_text().split() == want, n["address"]
    assert ClusterPaths(work / "efs").drain_done(join["instance_id"]).exists()
    assert_nothing_left(tmp_path, report)


@pytest.mark.slow
def test_failed_data_preparation_keeps_the_node_out(tmp_path: Path):
    code, out, report = run_demo(tmp_path, "--elastic", "--add-worker-after", "2",
                                 "--fail-data-prep", "--require-acc", "0.95")
    assert code == 0, out
    el = report["elastic"]
    join = el["join"]
    assert el["world_sizes"] == [3], el  # the job never saw the node
    assert "first_step_s" not in join
    assert f"{join['instance_id']}.failed" in el["prepared"]
    assert not any(join["address"] in x for x in el["membership_log"])
    assert report["final_acc"] >= 0.95
    assert_nothing_left(tmp_path, report)


def test_a_timing_the_job_cannot_hold_is_refused_before_anything_starts(tmp_path: Path):
    """The brief's command with an --epochs far too small: refused naming both sides, before
    moto or the deploy start (no work directory is created)."""
    res = subprocess.run(
        [sys.executable, "-m", "emulator.demo", "--workers", "2", "--elastic",
         "--add-worker-after", "20", "--remove-worker-after", "60", "--epochs", "5",
         "--work-dir", str(tmp_path / "work"), "--report", str(tmp_path / "r.json")],
        cwd=REPO_ROOT, env=demo_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--epochs 5 can end after 3.4 s of training" in res.stderr
    assert "acts up to 80 s after the first epoch" in res.stderr
    assert "omit --epochs to let the demo size the job" in res.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "r.json").exists()


def _scenario(*args: str) -> scenarios.ElasticScenario:
    from emulator.demo.cli import build_parser, validate

    parser = build_parser()
    ns = parser.parse_args(["--elastic", *args])
    validate(ns, parser)
    ctx = types.SimpleNamespace(ns=ns, elastic={"starts": []})
    return scenarios.ElasticScenario(ctx)  # type: ignore[arg-type]


@pytest.mark.parametrize(("args", "state", "says"), [
    (("--add-worker-after", "20"), {}, "ended before the scale-out due 20 s after the first"),
    (("--add-worker-after", "1", "--remove-worker-after", "3"),
     {"join": {"address": "127.20.128.9"}},
     "ended before the added worker 127.20.128.9 took a training step"),
    (("--add-worker-after", "1", "--remove-worker-after", "3"),
     {"join": {"address": "127.20.128.9", "first_step_s": 4.0}},
     "ended before the removal due 3 s after 127.20.128.9 joined"),
    (("--add-worker-after", "1", "--remove-worker-after", "3"),
     {"join": {"address": "127.20.128.9", "first_step_s": 4.0},
      "drain": {"address": "127.20.128.9", "instance_id": "i-0abc"}},
     "ended before training continued without 127.20.128.9"),
])
def test_a_scenario_the_job_outlived_fails_saying_what_did_not_happen(args, state, says):
    """The job succeeded, but not everything asked for happened while it trained: the demo
    fails (no report of success), naming the step and what to change."""
    scenario = _scenario(*args)
    scenario.el.update(state)
    job = JobRun(exit_code=0)
    with pytest.raises(DemoError) as err:
        scenario.finish(job)
    assert says in str(err.value)
    assert "give more --epochs (or none: the demo then sizes the job" in str(err.value)


def test_the_sized_job_outlasts_the_scenario_at_the_fastest_pace():
    """The sizing's lower bound of an epoch is the example's own step count times the step
    delay: the constant must match the example's data."""
    from bootstrap_scripts.examples import train_digits

    train = train_digits.load_data(0, 0.2)[2]
    assert len(train) == scenarios.TRAIN_SAMPLES
    ns = _scenario("--add-worker-after", "20", "--remove-worker-after", "60").ctx.ns
    need = scenarios.elastic_seconds(ns, budgets=True)
    assert need == 20 + 60 + scenarios.JOIN_BUDGET_S + scenarios.DRAIN_BUDGET_S + \
        scenarios.TAIL_S
    assert ns.epochs * train_digits.steps_per_epoch(len(train), 64) * \
        scenarios.STEP_DELAY >= need

"""dl-submit: the step it adds (listed by moto's EMR) and how it follows the step's state."""

from __future__ import annotations

import os
import subprocess
import sys

import boto3
import pytest

from bootstrap_scripts.emr import submit
from tests.conftest import REGION, REPO_ROOT
from tests.support.emr import make_cluster


def test_submit_adds_a_command_runner_step_that_moto_lists(moto_reset: str,
                                                           capsys: pytest.CaptureFixture) -> None:
    cluster_id = make_cluster(moto_reset, core=1)
    client = boto3.client("emr", region_name=REGION, endpoint_url=moto_reset)
    code = submit.main(["--emr", cluster_id, "--", "python", "train.py", "--epochs", "2"],
                       client=client)
    assert code == 0
    step_id = capsys.readouterr().out.strip()
    assert step_id.startswith("s-")
    steps = client.list_steps(ClusterId=cluster_id)["Steps"]
    assert [s["Id"] for s in steps] == [step_id]
    step = steps[0]
    assert step["Config"]["Jar"] == "command-runner.jar"
    assert step["Config"]["Args"] == ["/usr/local/bin/dl-run", "python", "train.py",
                                      "--epochs", "2"]
    assert step["ActionOnFailure"] == "CONTINUE"
    assert step["Name"] == "dl-run python train.py --epochs 2"


def test_runner_options_pass_through_to_dl_run(moto_reset: str) -> None:
    """Everything after the first ``--`` goes to dl-run, including its own ``--``."""
    cluster_id = make_cluster(moto_reset, core=1)
    client = boto3.client("emr", region_name=REGION, endpoint_url=moto_reset)
    assert submit.main(["--emr", cluster_id, "--name", "horovod run", "--action-on-failure",
                        "CANCEL_AND_WAIT", "--", "--launcher", "horovod", "--", "python",
                        "train.py"], client=client) == 0
    step = client.list_steps(ClusterId=cluster_id)["Steps"][0]
    assert step["Config"]["Args"] == ["/usr/local/bin/dl-run", "--launcher", "horovod", "--",
                                      "python", "train.py"]
    assert step["Name"] == "horovod run"
    assert step["ActionOnFailure"] == "CANCEL_AND_WAIT"


def test_console_entry_point_runs_as_a_process(moto_reset: str) -> None:
    cluster_id = make_cluster(moto_reset, core=1)
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_reset, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "bootstrap_scripts.emr.submit", "--emr",
                           cluster_id, "--region", REGION, "--", "python", "train.py"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    client = boto3.client("emr", region_name=REGION, endpoint_url=moto_reset)
    assert [s["Id"] for s in client.list_steps(ClusterId=cluster_id)["Steps"]] == [
        proc.stdout.strip()]


def test_unknown_cluster_is_a_clear_error(moto_reset: str, capsys: pytest.CaptureFixture) -> None:
    client = boto3.client("emr", region_name=REGION, endpoint_url=moto_reset)
    code = submit.main(["--emr", "j-NOSUCHCLUSTER", "--", "python", "t.py"], client=client)
    assert code == submit.EXIT_STEP_FAILED
    assert "EMR request for cluster j-NOSUCHCLUSTER failed" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "needle"), [
    (["--emr", "cluster-1", "--", "python", "t.py"], "--emr must be an EMR cluster id"),
    (["--emr", "j-1ABC"], "no training command given"),
    (["--emr", "j-1ABC", "--"], "no training command given"),
])
def test_usage_errors(argv: list[str], needle: str, capsys: pytest.CaptureFixture) -> None:
    assert submit.main(argv, client=object()) == submit.EXIT_USAGE
    assert needle in capsys.readouterr().err


WAIT_ARGV = ["--emr", "j-1ABC", "--wait", "--poll", "0", "--", "python", "t.py"]


class ScriptedEmr:
    """A stand-in EMR client that walks a step through given states (no timing involved)."""

    def __init__(self, states: list[str], failure: dict | None = None) -> None:
        self.states = list(states)
        self.failure = failure or {}
        self.added: list[dict] = []

    def add_job_flow_steps(self, JobFlowId: str, Steps: list[dict]) -> dict:
        self.added.extend(Steps)
        return {"StepIds": ["s-SCRIPTED"]}

    def describe_step(self, ClusterId: str, StepId: str) -> dict:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        status = {"State": state}
        if state == "FAILED":
            status["FailureDetails"] = self.failure
        return {"Step": {"Status": status}}


def test_wait_prints_each_state_and_succeeds_on_completed(capsys: pytest.CaptureFixture) -> None:
    emr = ScriptedEmr(["PENDING", "PENDING", "RUNNING", "COMPLETED"])
    assert submit.main(WAIT_ARGV, client=emr) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "s-SCRIPTED"
    assert err.splitlines() == ["s-SCRIPTED PENDING", "s-SCRIPTED RUNNING",
                                "s-SCRIPTED COMPLETED"]


def test_wait_reports_the_failure_reason_and_log(capsys: pytest.CaptureFixture) -> None:
    emr = ScriptedEmr(["RUNNING", "FAILED"], failure={
        "Reason": "Unknown Error.", "Message": "dl-run exited 1",
        "LogFile": "s3://logs/emr-logs/j-1ABC/steps/s-SCRIPTED/stderr.gz"})
    assert submit.main(WAIT_ARGV, client=emr) == 1
    err = capsys.readouterr().err
    assert "step s-SCRIPTED on j-1ABC ended FAILED" in err
    assert "dl-run exited 1" in err and "steps/s-SCRIPTED/stderr.gz" in err


def test_wait_timeout_leaves_the_step_running() -> None:
    ticks = iter(range(100))
    emr = ScriptedEmr(["RUNNING"])
    with pytest.raises(submit.SubmitError, match="still RUNNING after 3s") as info:
        submit.wait_for_step(emr, "j-1ABC", "s-1", poll=1, timeout=3, say=lambda _m: None,
                             sleep=lambda _s: None, clock=lambda: float(next(ticks)))
    assert info.value.code == submit.EXIT_TIMEOUT


def test_step_definition_is_shared_with_the_construct() -> None:
    step = submit.dl_run_step(["python", "train.py"])
    assert step == {"Name": "dl-run python train.py", "ActionOnFailure": "CONTINUE",
                    "HadoopJarStep": {"Jar": "command-runner.jar",
                                      "Args": ["/usr/local/bin/dl-run", "python", "train.py"]}}
    assert len(submit.dl_run_step(["x" * 400])["Name"]) == submit.MAX_STEP_NAME

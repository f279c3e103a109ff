"""A job whose input could not be made ready (its checkpoint restore or its data staging
failed, so its command never ran) fails as ``input``, quoting the step's cause: not
``user-code``, not a node's fault; retried no more than a code failure (no processes)."""

from __future__ import annotations

import pytest

from bootstrap_scripts.jobs.controller.attempts import outcome
from bootstrap_scripts.jobs.engine.classify import FailureClass, FailureKind
from bootstrap_scripts.jobs.engine.restart_policy import Action, Policy, decide
from bootstrap_scripts.jobs.engine.summary import summarize
from bootstrap_scripts.jobs.engine.watch import Watch
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import JobResult, NodeResult, ShareExit
from bootstrap_scripts.protocol.run_request import RunRequest

DENIED = "error: AccessDenied reading s3://ckpts/old/ (the job role may read its own prefix)"


def failed_step(tmp_path, job_id: str) -> Watch:
    """The restore or staging job ``job_id`` on one node, whose command failed."""
    spec = JobSpec(job_id=job_id, launcher="each",
                   shares=(Share(0, "10.0.1.0", (Proc(argv=("true",)),)),))
    paths = ClusterPaths(tmp_path).job(job_id)
    paths.nodes.mkdir(parents=True)
    (paths.nodes / "0.log").write_text(DENIED + "\n")  # the node's log, as last_error_line reads it
    w = Watch(spec, paths, tmp_path, RunRequest(job_id=job_id, command=("true",)))
    w.exits[0] = ShareExit(rank=0, address="10.0.1.0", returncode=1, finished_at=1.0)
    return w


@pytest.mark.parametrize(("suffix", "what"), [(".restore", "restoring its checkpoint"),
                                              (".stage", "staging its data")])
def test_a_failed_restore_or_staging_is_the_jobs_input(tmp_path, capsys, suffix, what):
    verdict = summarize(failed_step(tmp_path, "train.1" + suffix))
    assert (verdict.failure.failure_class, verdict.failure.kind) == (
        FailureClass.INPUT, FailureKind.INPUT)
    assert verdict.failure.detail.startswith(f"{what} failed: node rank 0 (10.0.1.0)")
    err = capsys.readouterr().err
    assert "cause: input (input)" in err and "user-code" not in err
    assert DENIED in err  # the one line that says why


def test_the_controller_reads_the_attempts_input_step(tmp_path):
    summarize(failed_step(tmp_path, "train.1.restore"))
    attempt = ClusterPaths(tmp_path).job("train.1")  # never started: no result of its own
    failure = outcome(attempt, runner_code=1)
    assert failure.kind is FailureKind.INPUT and "restoring its checkpoint" in failure.detail
    # a job whose own command ran and failed stays user-code
    ran = ClusterPaths(tmp_path).job("other.1")
    ran.nodes.mkdir(parents=True)
    store.write_record(ran.result, JobResult(job_id="other.1", status="failed",
                                             launcher="each", elastic=False, nodes=(
                                                 NodeResult(rank=0, address="10.0.1.0",
                                                            returncode=1),)))
    assert outcome(ran, runner_code=1).failure_class is FailureClass.USER_CODE


def test_an_input_failure_is_retried_no_more_than_a_code_failure(tmp_path):
    summarize(failed_step(tmp_path, "train.1.stage"))
    failure = outcome(ClusterPaths(tmp_path).job("train.1"), runner_code=1)
    policy = Policy(max_restarts=5, max_code_restarts=0)
    decision = decide(failure, restarts=0, code_restarts=0, policy=policy)
    assert decision.action is Action.FAIL and "input" in decision.reason

"""An image job whose pull failed on a node (``<job-id>.pull``, before any rank) fails as
``infrastructure`` (``image-pull``), naming the node and the cause: never ``user-code``.

Written against the records the runner and the controller read (a pull job's result and
exits on disk, the exit status being ``dl-container pull``'s); before the pull step
existed the controller read such an attempt as the code's failure.
"""

from __future__ import annotations

import sys

from bootstrap_scripts.jobs.controller.attempts import outcome
from bootstrap_scripts.jobs.engine.classify import FailureClass, FailureKind
from bootstrap_scripts.jobs.engine.image_pull import pull_request
from bootstrap_scripts.jobs.engine.restart_policy import Action, Policy, decide
from bootstrap_scripts.jobs.engine.summary import summarize
from bootstrap_scripts.jobs.engine.watch import Watch
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import JobResult, NodeResult, ShareExit
from bootstrap_scripts.protocol.run_request import RunRequest

IMAGE = "127.0.0.1:5000/team/train:v1@sha256:" + "0a" * 32
NODES = ("10.0.1.0", "10.0.1.1")
NOT_FOUND_EXIT = 4  # dl-container pull's status for "not found" (containers/causes.py)


def failed_pull(tmp_path, job_id: str = "train.1.pull") -> Watch:
    """The pull job of ``train.1`` on two nodes: rank 0 pulled, rank 1 found no image."""
    spec = JobSpec(job_id=job_id, launcher="each", shares=tuple(
        Share(rank, address, (Proc(argv=("python", "-m", "m", "pull", IMAGE)),))
        for rank, address in enumerate(NODES)))
    paths = ClusterPaths(tmp_path).job(job_id)
    paths.nodes.mkdir(parents=True)
    w = Watch(spec, paths, tmp_path, RunRequest(job_id=job_id, command=("true",)))
    w.exits[0] = ShareExit(rank=0, address=NODES[0], returncode=0, finished_at=1.0)
    w.exits[1] = ShareExit(rank=1, address=NODES[1], returncode=NOT_FOUND_EXIT,
                           finished_at=1.0)
    return w


def write_pull_records(tmp_path) -> None:
    """The pull job's result and exits as its runner leaves them, written directly."""
    paths = ClusterPaths(tmp_path).job("train.1.pull")
    paths.nodes.mkdir(parents=True)
    store.write_record(paths.result, JobResult(
        job_id="train.1.pull", status="failed", launcher="each", elastic=False,
        nodes=(NodeResult(rank=0, address=NODES[0], returncode=0),
               NodeResult(rank=1, address=NODES[1], returncode=NOT_FOUND_EXIT))))
    for rank, code in ((0, 0), (1, NOT_FOUND_EXIT)):
        store.write_record(paths.exit(rank), ShareExit(rank=rank, address=NODES[rank],
                                                       returncode=code, finished_at=1.0))


def test_the_controller_reads_a_failed_pull_as_infrastructure_naming_node_and_cause(tmp_path):
    write_pull_records(tmp_path)
    attempt = ClusterPaths(tmp_path).job("train.1")  # never started: no result of its own
    failure = outcome(attempt, runner_code=1)
    assert failure is not None
    assert failure.failure_class is FailureClass.INFRASTRUCTURE, failure
    assert failure.kind is FailureKind.IMAGE_PULL
    assert f"node rank 1 ({NODES[1]}): not found" in failure.detail
    assert NODES[0] not in failure.detail  # the node that pulled is not blamed
    assert (failure.address, failure.rank) == (NODES[1], 1)


def test_the_runners_summary_names_node_cause_and_class(tmp_path, capsys):
    verdict = summarize(failed_pull(tmp_path))
    assert verdict.status == "failed"
    assert (verdict.failure.failure_class, verdict.failure.kind) == (
        FailureClass.INFRASTRUCTURE, FailureKind.IMAGE_PULL)
    assert verdict.failure.detail == (f"pulling {IMAGE} failed on node rank 1 ({NODES[1]}): "
                                      "not found")
    err = capsys.readouterr().err
    assert "cause: infrastructure (image-pull)" in err and "user-code" not in err


def test_a_failed_pull_is_retried_as_the_clusters_fault_not_the_codes(tmp_path):
    write_pull_records(tmp_path)
    failure = outcome(ClusterPaths(tmp_path).job("train.1"), runner_code=1)
    decision = decide(failure, restarts=0, code_restarts=0,
                      policy=Policy(max_restarts=3, max_code_restarts=0))
    assert decision.action is Action.RESTART and "infrastructure" in decision.reason


def test_the_pull_job_runs_dl_container_pull_on_every_node_with_a_fixed_environment():
    job = RunRequest(job_id="train.1", command=("python", "train.py"), image=IMAGE,
                     env={"SECRET": "s3cr3t", "LD_PRELOAD": "/x.so", "PATH": "/mine"},
                     forward=("SECRET",), data="s3://data-bucket/p", mounts=("s3://data-bucket/q:/mnt/q",),
                     nnodes="1:4", elastic=True, cwd="/home/u/code")
    pull = pull_request(job)
    assert pull.job_id == "train.1.pull" and pull.launcher == "each"
    assert pull.command == (sys.executable, "-m", "bootstrap_scripts.containers.run", "pull",
                            IMAGE)
    assert set(pull.env) == {"PYTHONPATH", "PYTHONUNBUFFERED"} and pull.forward == ()
    assert (pull.cwd, pull.image, pull.data, pull.mounts, pull.elastic, pull.nnodes) == (
        "/", "", "", (), False, "")


def test_every_node_told_the_image_is_not_there_is_the_jobs_input_not_retried(tmp_path):
    """Not found (or access denied) on every node is an answer about the image, not a node:
    a retry would be told the same. One node that pulled makes it the cluster's again."""
    paths = ClusterPaths(tmp_path).job("train.1.pull")
    paths.nodes.mkdir(parents=True)
    store.write_record(paths.result, JobResult(
        job_id="train.1.pull", status="failed", launcher="each", elastic=False,
        nodes=tuple(NodeResult(rank=r, address=a, returncode=NOT_FOUND_EXIT)
                    for r, a in enumerate(NODES))))
    for rank, address in enumerate(NODES):
        store.write_record(paths.exit(rank), ShareExit(rank=rank, address=address,
                                                       returncode=NOT_FOUND_EXIT,
                                                       finished_at=1.0))
    failure = outcome(ClusterPaths(tmp_path).job("train.1"), runner_code=1)
    assert failure is not None and failure.kind is FailureKind.INPUT, failure
    assert "every node" in failure.detail and "not found" in failure.detail
    decision = decide(failure, restarts=0, code_restarts=0,
                      policy=Policy(max_restarts=3, max_code_restarts=0))
    assert decision.action is not Action.RESTART, decision


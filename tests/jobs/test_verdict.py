"""The runner's summary and the restart policy read one classifier: the verdict a run
returns is what ``classify`` says of the result it wrote (no processes)."""

from __future__ import annotations

import signal

import pytest

from bootstrap_scripts.jobs.engine.classify import FailureClass, FailureKind, classify
from bootstrap_scripts.jobs.engine.summary import summarize
from bootstrap_scripts.jobs.engine.watch import Watch
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import EXECUTOR_RESTARTED_REASON, JobSpec, Proc, Share
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import JobResult, ShareExit
from bootstrap_scripts.protocol.run_request import RunRequest


def watch(tmp_path, exits: dict[int, ShareExit], lost: dict[int, str] | None = None) -> Watch:
    spec = JobSpec(job_id="j.1", launcher="each", shares=tuple(
        Share(r, f"10.0.1.{r}", (Proc(argv=("true",)),)) for r in (0, 1)))
    paths = ClusterPaths(tmp_path).job("j.1")
    paths.nodes.mkdir(parents=True)
    w = Watch(spec, paths, tmp_path, RunRequest(job_id="j.1", command=("true",)))
    w.exits.update(exits)
    w.lost.update(lost or {})
    return w


def exit_rec(rank: int, rc: int, *, at: float, cancelled: bool = False, reason: str = "",
             fault: str = "") -> ShareExit:
    return ShareExit(rank=rank, address=f"10.0.1.{rank}", returncode=rc,
                     signal=-rc if rc < 0 else 0, cancelled=cancelled, reason=reason,
                     finished_at=at, fault=fault)


@pytest.mark.parametrize(("exits", "lost", "cls", "kind", "rank"), [
    ({0: exit_rec(0, 0, at=1), 1: exit_rec(1, 0, at=1)}, {}, None, None, None),
    ({0: exit_rec(0, 1, at=2), 1: exit_rec(1, -15, at=3, cancelled=True)}, {},
     FailureClass.USER_CODE, FailureKind.CODE, 0),
    ({0: exit_rec(0, 1, at=2)}, {1: "node 1 (10.0.1.1): executor heartbeat stopped 11 s ago"},
     FailureClass.NODE_LOST, FailureKind.NODE_LOST, 1),
    ({0: exit_rec(0, 1, at=2), 1: exit_rec(1, -signal.SIGKILL, at=1, cancelled=True,
                                           reason=EXECUTOR_RESTARTED_REASON + "; stopped")},
     {}, FailureClass.INFRASTRUCTURE, FailureKind.EXECUTOR_RESTARTED, 1),
    # the executor could not tell how the share ended (its status was lost, EFS was full)
    ({0: exit_rec(0, 1, at=2, fault="infrastructure",
                  reason="cannot record the start of the share"),
      1: exit_rec(1, -15, at=3, cancelled=True)},
     {}, FailureClass.INFRASTRUCTURE, FailureKind.EXECUTOR_RESTARTED, 0),
])
def test_the_verdict_is_the_classifiers_answer_on_the_written_result(tmp_path, capsys, exits,
                                                                      lost, cls, kind, rank):
    w = watch(tmp_path, exits, lost)
    verdict = summarize(w)
    result = store.read_record(w.paths.result, JobResult)
    assert verdict.failure == classify(result, exits)
    if cls is None:
        assert (verdict.status, verdict.exit_code, verdict.failure) == ("succeeded", 0, None)
        return
    assert (verdict.status, verdict.exit_code) == ("failed", 1)
    assert (verdict.failure.failure_class, verdict.failure.kind, verdict.failure.rank) == (
        cls, kind, rank)
    err = capsys.readouterr().err
    assert f"job j.1 FAILED: node rank {rank} " in err
    assert f"cause: {cls.value} ({kind.value})" in err


@pytest.mark.parametrize("why", ["cancelled by the job controller",
                                 "--max-cost 0.01 USD reached: spent 0.0101 USD"])
def test_shares_stopped_by_a_cancel_from_outside_are_that_cancel_not_user_code(
        tmp_path, capsys, why):
    """A user's cancel and the cost cap reach the attempt as its cancel marker (written by
    the job controller, not by this runner): every share then ends stopped (-9, -15), and
    the cause is the cancel, quoted, never ``user-code``."""
    exits = {0: exit_rec(0, -9, at=2, cancelled=True),
             1: exit_rec(1, -15, at=3, cancelled=True)}
    w = watch(tmp_path, exits)
    store.atomic_write(w.paths.cancel, why + "\n")
    verdict = summarize(w)
    assert (verdict.status, verdict.failure.failure_class, verdict.failure.kind) == (
        "cancelled", FailureClass.CANCELLED, FailureKind.CANCELLED)
    assert verdict.failure.detail == why
    err = capsys.readouterr().err
    assert f"job j.1 cancelled: {why}" in err and "cause: cancelled (cancelled)" in err
    assert "user-code" not in err and "FAILED" not in err


def test_shares_stopped_without_a_cancel_from_outside_still_name_the_first_to_end(
        tmp_path, capsys):
    """Without a cancel from outside, only stopped shares: the first to end is the cause
    (as before: the runner stopped the others after it)."""
    exits = {0: exit_rec(0, -15, at=2, cancelled=True),
             1: exit_rec(1, -15, at=3, cancelled=True)}
    verdict = summarize(watch(tmp_path, exits))
    assert (verdict.status, verdict.failure.kind, verdict.failure.rank) == (
        "failed", FailureKind.CODE, 0)

"""What the demo's console shows of a job's output during a fault drill."""

from __future__ import annotations

import io

from rich.console import Console

from emulator.demo.cli import build_parser
from emulator.demo.joblog import JobRun
from emulator.demo.orchestration import Demo

PEER_LOST = [
    "[1 127.20.128.5] Traceback (most recent call last):",
    "[1 127.20.128.5] RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [127.20.128.6]:41234",
    "[1 127.20.128.5] c10::Error: Connection reset by peer",
]


def demo(tmp_path) -> tuple[Demo, io.StringIO]:
    out = io.StringIO()
    ns = build_parser().parse_args(["--work-dir", str(tmp_path / "work")])
    return Demo(ns, Console(file=out, width=200)), out


def test_tracebacks_of_an_attempt_that_was_restarted_are_counted_not_shown(tmp_path):
    d, out = demo(tmp_path)
    res = JobRun()
    for line in PEER_LOST:
        d.show_job_line(line, res)
    d.show_job_line("[dl-run] ---- restart 1 of job j-1 after attempt 1: node-lost", res)
    text = out.getvalue()
    assert "Traceback" not in text and "c10::Error" not in text
    assert "3 error line(s) of the ended attempt" in text
    assert "restart 1 of job j-1" in text


def test_errors_of_the_last_attempt_are_kept_for_the_end(tmp_path):
    d, out = demo(tmp_path)
    res = JobRun()
    d.show_job_line("[0 127.20.0.5] resumed from epoch 4", res)
    for line in PEER_LOST:
        d.show_job_line(line, res)
    assert "resumed from epoch 4" in out.getvalue()  # shown at once
    assert res.release_errors() == PEER_LOST  # what follow_job prints when the job ends


def test_a_failure_no_runner_summed_up_is_told_by_its_first_exception_line():
    """A Slurm job's output has no [dl-run] verdict, and an agent's TCPStore failure ends in
    dozens of C++ frames: the cause quoted is the exception's own line, not the last frame."""
    from emulator.demo.joblog import failure_cause

    run = JobRun(job_id="1", how="sbatch")
    lines = ["[0 task0] Traceback (most recent call last):",
             '[0 task0]   File "x.py", line 1, in <module>',
             "[0 task0] torch.distributed.DistNetworkError: The server socket has failed to "
             "listen on any local network address. port: 29500, name: EADDRINUSE",
             *[f"[0 task0] frame #{i}: <unknown function> + 0x{i:x}" for i in range(40)],
             "[1 task1] torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]
    for line in lines:
        run.keep_line(line)
    assert not any("DistNetworkError" in ln for ln in run.output_tail)  # scrolled out
    cause = failure_cause(run.output_tail, run.first_exception)
    assert cause.startswith("[0 task0] torch.distributed.DistNetworkError: The server socket")
    # a runner's own verdict still wins
    assert failure_cause(["[dl-run] job 1 FAILED: node 2 lost"], run.first_exception) \
        == "node 2 lost"

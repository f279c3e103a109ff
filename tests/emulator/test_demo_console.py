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

"""What dlc shows of the idle stop: ``dlc status``'s line from ``dl-jobs --json``'s record,
and ``dlc submit``'s note when the job's submission starts stopped workers."""

from __future__ import annotations

import pytest

from dlc import jobs, status
from dlc.errors import DlcError


def test_status_says_when_the_workers_stop_and_that_they_stopped() -> None:
    idle = {"state": "idle", "idle_since": 1_700_000_000.0, "stop_at": 1_700_003_600.0,
            "idle_seconds": 3600.0, "message": ""}
    line = status.idle_line(idle)
    assert line == (f"idle stop: idle since {status.clock(1_700_000_000.0)}, workers stop at "
                    f"{status.clock(1_700_003_600.0)}")
    stopped = {**idle, "state": "stopped", "stopped_at": 1_700_003_601.0, "desired_before": 2}
    line = status.idle_line(stopped)
    assert f"workers STOPPED at {status.clock(1_700_003_601.0)} (were 2)" in line
    assert "dlc submit scales them back" in line
    # the record written before the Auto Scaling call: the stop may not be made yet
    line = status.idle_line({**stopped, "state": "stopping"})
    assert f"workers STOPPING since {status.clock(1_700_003_601.0)} (were 2)" in line
    assert "STOPPED" not in line
    assert status.idle_line({"state": "busy", "idle_seconds": 900.0}) == (
        "idle stop: busy; workers stop 15 min after the last job")
    assert status.idle_line({"state": "disabled"}) == "idle stop: off (idleStopMinutes 0)"
    failed = {**idle, "message": "stop failed: AccessDenied"}
    assert status.idle_line(failed).endswith("(stop failed: AccessDenied)")
    assert status.idle_line(None) == ""  # an older master's dl-jobs: nothing said


def test_submit_returns_the_job_id_and_dl_runs_note() -> None:
    assert jobs.submitted({"job_id": "j1"}) == ("j1", "")
    assert jobs.submitted({"job_id": "j1", "note": "idle stop: workers STOPPED"}) == (
        "j1", "idle stop: workers STOPPED")
    with pytest.raises(DlcError, match="printed no job id"):
        jobs.submitted(["j1"])

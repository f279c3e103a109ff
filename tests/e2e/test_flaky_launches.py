"""Launches that fail, then succeed, end to end (``--flaky-launches``).

The first two worker launches fail with EC2's insufficient-capacity error (the emulator's
fault hook); the real Lambda leaves them to the group's own retries instead of lowering the
worker count; the emulated group retries, the launches succeed, and the cluster forms and
trains at full size. Before launch errors were classified, an error seen while the group was
short lowered it to what had launched, and the cluster formed short for good. (Whether an
error reaches the Lambda before the group's retry filled the group depends on the machine's
pace, so both outcomes are accepted; tests/lambda/test_launch_errors.py pins the decision.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.demo import assert_nothing_left, run_demo


@pytest.mark.slow
def test_flaky_launches_are_retried_and_the_cluster_forms_at_full_size(tmp_path: Path) -> None:
    code, out, report = run_demo(tmp_path, "--workers", "2", "--flaky-launches", "2",
                                 "--epochs", "2", "--require-acc", "0.5")
    assert code == 0, out
    assert report["status"] == "succeeded"
    flaky = report["capacity"]["flaky"]
    assert flaky["asked"] == 2 and flaky["failed"] == 2
    # every launch error reached the Lambda, which left it to the group's retries (or, when
    # the retry had filled the group before the error was delivered, reported it set up);
    # it never lowered the group
    assert flaky["error_outcomes"], report["notifications"]
    assert set(flaky["error_outcomes"]) <= {"retry", "asg-setup-success"}
    assert flaky["left_to_retries"] == flaky["error_outcomes"].count("retry")
    assert flaky["causes"] in ([], ["InsufficientInstanceCapacity"])
    assert flaky["lowered"] == []
    assert (flaky["workers"], flaky["desired"]) == (2, 2)
    assert report["stack"]["groups"]["worker"]["desired"] == 2
    assert report["world_size"] == 3
    assert "flaky launches" in out
    assert_nothing_left(tmp_path, report)

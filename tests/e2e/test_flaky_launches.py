"""Launches that fail, then succeed, end to end (``--flaky-launches``).

The first two worker launches fail with EC2's insufficient-capacity error (the emulator's
fault hook); the real Lambda leaves them to the group's own retries instead of lowering the
worker count; the emulated group retries, the launches succeed, and the cluster forms and
trains at full size. Before launch errors were classified, the first error lowered the
worker group to what had launched, and the cluster formed short for good.
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
    assert flaky["left_to_retries"] >= 1  # the Lambda waited for the group's retries
    assert flaky["causes"] == ["InsufficientInstanceCapacity"]
    assert flaky["lowered"] == []  # never lowered
    assert (flaky["workers"], flaky["desired"]) == (2, 2)
    assert report["stack"]["groups"]["worker"]["desired"] == 2
    assert report["world_size"] == 3
    assert "flaky launches" in out
    assert_nothing_left(tmp_path, report)

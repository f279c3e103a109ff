"""The drills' table: printed once every drill of the session ran, then checked, so that a
failing row fails ``make chaos`` only after every row was seen."""

from __future__ import annotations

import pytest

from tests.chaos.drills import ROWS, table

pytestmark = pytest.mark.chaos


def test_zz_every_drill_row_passes():
    assert ROWS, "no drill ran"
    print("\n\nFault drills (make chaos):\n" + table(ROWS) + "\n")
    failed = [r.drill for r in ROWS if not r.passed]
    assert not failed, f"drills that failed: {failed}"

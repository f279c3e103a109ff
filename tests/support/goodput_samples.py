"""Made-up progress samples for the goodput bench's arithmetic (tests/chaos/goodput.py)."""

from __future__ import annotations

from tests.chaos.goodput import Sample


def run(attempt: int, pid: int, start: float, first: int, last: int, *, ranks: int,
        step_s: float = 0.5) -> list[Sample]:
    """Every rank's samples of one generation: steps first..last, one every ``step_s``."""
    out = []
    for step in range(first, last + 1):
        t = start + (step - first) * step_s
        recent = tuple([step_s] * min(16, step - first))
        out += [Sample(attempt, r, pid + r, start, step, t, recent) for r in range(ranks)]
    return out


def schedule() -> list[Sample]:
    # 4 ranks steps 1..20 (t 100..109.5); worker lost at 110; 3 survivors resume from the
    # step-18 checkpoint at 120 (steps 19..30); the replacement joins: 4 ranks from 31 at 130
    return (run(1, 100, 100.0, 1, 20, ranks=4) + run(1, 200, 120.0, 19, 30, ranks=3)
            + run(1, 300, 130.0, 31, 40, ranks=4))


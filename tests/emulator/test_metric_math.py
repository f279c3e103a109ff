"""The metric math the emulator's alarm evaluator plays (emulator/metric_math.py): the
stack's two math alarms' expressions, CloudWatch's point-by-point rule for missing points,
and a clear refusal of what it does not play."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from emulator import metric_math

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T = [T0 + timedelta(minutes=i) for i in range(4)]


def test_the_idle_gpu_expression_is_one_only_while_a_job_runs_on_idle_gpus() -> None:
    jobs = {T[0]: 1, T[1]: 1, T[2]: 0, T[3]: 1}
    gpu = {T[0]: 2, T[1]: 80, T[2]: 1}  # no GPU point at T[3]
    out = metric_math.evaluate("IF(jobs > 0 AND gpu < 5, 1, 0)", {"jobs": jobs, "gpu": gpu})
    assert out == {T[0]: 1.0, T[1]: 0.0, T[2]: 0.0}


def test_arithmetic_comparisons_or_not_and_division_by_zero() -> None:
    a, b = {T[0]: 3, T[1]: 1}, {T[0]: 1, T[1]: 0}
    assert metric_math.evaluate("a - b", {"a": a, "b": b}) == {T[0]: 2.0, T[1]: 1.0}
    assert metric_math.evaluate("a / b", {"a": a, "b": b}) == {T[0]: 3.0}
    assert metric_math.evaluate("a >= 3 OR NOT b", {"a": a, "b": b}) == {T[0]: 1.0, T[1]: 1.0}
    assert metric_math.evaluate("-a * 2 + 1", {"a": a}) == {T[0]: -5.0, T[1]: -1.0}
    assert metric_math.names("IF(x != 1, y, 0)") == {"x", "y"}


@pytest.mark.parametrize("expression", ["SUM(METRICS())", "__import__('os')", "a.b",
                                        "SEARCH('{A,B}', 'Average', 60)", "a[0]", "'x'"])
def test_what_is_not_played_is_refused_naming_the_expression(expression: str) -> None:
    with pytest.raises(metric_math.UnsupportedExpression, match="metric math"):
        metric_math.evaluate(expression, {"a": {T[0]: 1.0}})


def test_an_unknown_id_is_named() -> None:
    with pytest.raises(metric_math.UnsupportedExpression, match=r"no query with id \['b'\]"):
        metric_math.evaluate("a - b", {"a": {T[0]: 1.0}})

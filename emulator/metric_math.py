"""The part of CloudWatch metric math that alarms use, which moto does not evaluate.

moto's GetMetricData answers a math query only when the expression is the bare id of
another query; an alarm such as ``IF(jobs > 0 AND gpu < 5, 1, 0)`` or
``desired - inservice`` would never get a value. CloudWatch evaluates such an expression
point by point over the series it names
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/using-metric-math.html):
arithmetic (``+ - * /``), comparisons and ``AND``/``OR``/``NOT`` giving 1 or 0, and
``IF(condition, then, else)``. :func:`evaluate` does that for the timestamps every
named series has (a point missing in one series is missing in the result, as CloudWatch
leaves it). An expression using anything else (functions such as ``SUM`` or ``SEARCH``,
which alarms cannot use either) raises :class:`UnsupportedExpression` naming it: the
evaluator says so instead of guessing.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Mapping
from datetime import datetime

Series = Mapping[datetime, float]

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv}
_COMPARE = {ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Lt: operator.lt,
            ast.LtE: operator.le, ast.Eq: operator.eq, ast.NotEq: operator.ne}
_WORDS = {"AND": " and ", "OR": " or ", "NOT": " not "}


class UnsupportedExpression(ValueError):
    """An expression outside the subset above."""


def parse(expression: str) -> ast.expr:
    """The expression as a Python syntax tree, checked against the subset."""
    text = re.sub(r"\b(AND|OR|NOT)\b", lambda m: _WORDS[m.group(1)], expression)
    text = text.replace("!=", " != ")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise UnsupportedExpression(f"metric math {expression!r}: not understood") from None
    for node in ast.walk(tree):
        allowed = (ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.USub, ast.Not, ast.BinOp,
                   ast.Compare, ast.Name, ast.Load, ast.Constant, *_BINARY, *_COMPARE)
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id == "IF"
                    and len(node.args) == 3 and not node.keywords):
                raise UnsupportedExpression(
                    f"metric math {expression!r}: only IF(condition, then, else) is played")
        elif isinstance(node, ast.Constant) and not isinstance(node.value, int | float):
            raise UnsupportedExpression(f"metric math {expression!r}: {node.value!r}")
        elif not isinstance(node, allowed) and not (
                isinstance(node, ast.Name) and node.id == "IF"):
            raise UnsupportedExpression(
                f"metric math {expression!r}: {type(node).__name__} is not played")
    return tree


def names(expression: str) -> set[str]:
    """The query ids an expression reads."""
    return {n.id for n in ast.walk(parse(expression))
            if isinstance(n, ast.Name) and n.id != "IF"}


def _value(node: ast.expr, point: Mapping[str, float]) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return point[node.id]
    if isinstance(node, ast.UnaryOp):
        inner = _value(node.operand, point)
        return -inner if isinstance(node.op, ast.USub) else float(not inner)
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, point), _value(node.right, point)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ZeroDivisionError
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.BoolOp):
        values = [bool(_value(v, point)) for v in node.values]
        return float(all(values) if isinstance(node.op, ast.And) else any(values))
    if isinstance(node, ast.Compare):
        left = _value(node.left, point)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _value(right_node, point)
            if not _COMPARE[type(op)](left, right):
                return 0.0
            left = right
        return 1.0
    assert isinstance(node, ast.Call)  # IF, checked by parse
    cond, then, other = node.args
    return _value(then, point) if _value(cond, point) else _value(other, point)


def evaluate(expression: str, series: Mapping[str, Series]) -> dict[datetime, float]:
    """The expression's series: one point per timestamp every series it names has (a
    division by zero leaves that point out, as CloudWatch does)."""
    tree = parse(expression)
    used = names(expression)
    missing = used - set(series)
    if missing:
        raise UnsupportedExpression(
            f"metric math {expression!r}: no query with id {sorted(missing)}")
    stamps = set.intersection(*(set(series[n]) for n in used)) if used else set()
    out = {}
    for stamp in sorted(stamps):
        try:
            out[stamp] = _value(tree, {n: series[n][stamp] for n in used})
        except ZeroDivisionError:
            continue
    return out

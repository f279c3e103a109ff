"""A test module never imports another test module: what two modules share lives in
tests/support/ (or a helper module of its package), so collecting or changing one test file
never runs or breaks another's module-level code."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
    return out


def test_no_test_module_imports_another_test_module():
    offenders = {
        str(path.relative_to(TESTS.parent)): sorted(
            m for m in imported_modules(path)
            if m.startswith("tests.") and m.rsplit(".", 1)[-1].startswith("test_"))
        for path in sorted(TESTS.rglob("*.py"))
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}, "move the shared helpers to tests/support/"

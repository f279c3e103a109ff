"""The job engine's layout: one sub-package per program, all of them on one shared core.

``engine`` imports none of the programs; a program imports ``engine`` and itself, never
another program (the controller starts ``dl-run`` as a process, by module name, not by
import). A module that breaks this shows up here by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

JOBS = Path(__file__).resolve().parents[2] / "bootstrap_scripts" / "jobs"
PROGRAMS = ("cli", "executor", "controller")
PREFIX = "bootstrap_scripts.jobs."


def imported_parts(path: Path) -> set[str]:
    """The sub-packages of ``bootstrap_scripts.jobs`` that ``path`` imports from."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith(PREFIX):
                parts.add(name[len(PREFIX):].split(".")[0])
            elif name == "bootstrap_scripts.jobs":
                parts.add("")
    return parts


def modules(part: str) -> list[Path]:
    return sorted((JOBS / part).glob("*.py"))


def test_every_module_is_in_a_sub_package():
    assert [p.name for p in JOBS.glob("*.py")] == ["__init__.py"]


@pytest.mark.parametrize("path", modules("engine"), ids=lambda p: p.name)
def test_the_core_imports_no_program(path):
    assert imported_parts(path) <= {"engine"}, path


@pytest.mark.parametrize("part", PROGRAMS)
def test_a_program_imports_only_the_core_and_itself(part):
    wrong = {p.name: imported_parts(p) - {"engine", part} for p in modules(part)}
    assert not {k: v for k, v in wrong.items() if v}

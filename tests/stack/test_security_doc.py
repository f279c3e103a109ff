"""docs/security.md, the threat model, stays true: every test it names as the proof of a
line exists, and every known finding has a row (held with its proof, or open with what
would hold it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO_ROOT as REPO_ROOT_TEXT

REPO_ROOT = Path(REPO_ROOT_TEXT)
DOC = REPO_ROOT / "docs" / "security.md"
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
#: The findings this page must account for (a row each, by id).
FINDINGS = [f"F{i}" for i in range(1, 18)]


def doc() -> str:
    return DOC.read_text()


def test_every_named_proof_is_a_test_that_exists() -> None:
    refs = TEST_REF.findall(doc())
    assert len(refs) >= 8
    for path, name in refs:
        source = REPO_ROOT / path
        assert source.is_file(), f"docs/security.md names {path}, which does not exist"
        tree = ast.parse(source.read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in names, f"docs/security.md names {path}::{name}, which is not a test there"


def test_every_finding_has_one_row() -> None:
    """Open (its own row under Open) or held (a line marked "was F<n>"), exactly once."""
    text = doc()
    rows = re.findall(r"^\| (F\d+) \|", text, re.M)
    held = re.findall(r"^\| L\d+ \| \(was (F\d+)\)", text, re.M)
    assert sorted(rows + held, key=lambda r: int(r[1:])) == FINDINGS


def test_every_line_held_names_its_proof() -> None:
    for line in re.findall(r"^\| L\d+ \|.*$", doc(), re.M):
        assert TEST_REF.search(line), f"a line without a test that proves it: {line}"


def test_every_line_and_finding_id_is_used_once() -> None:
    ids = re.findall(r"^\| ([LF]\d+) \|", doc(), re.M)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)

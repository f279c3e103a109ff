"""checkov over both synthesized templates: nothing fails but what ``SKIPS`` in
``tests/stack/checkov_skips.py`` lists (each with its reason), and every skip is still
needed. checkov lives in its own venv (``make checkov-setup``: ``.venv-checkov``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from tests.stack.checkov_skips import SKIPS, checkov_binary, failed_checks
from tests.stack.synth import new_app

pytestmark = pytest.mark.skipif(
    checkov_binary() is None,
    reason="checkov is not installed: make checkov-setup (its own venv, .venv-checkov)")


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, str]]]:
    import app as app_module

    app = app_module.build_app(new_app())
    out = {}
    for name in ("DLClusterStack", "DLEmrClusterStack"):
        template = Template.from_stack(app.node.find_child(name)).to_json()  # type: ignore[arg-type]
        out[name] = failed_checks(template, tmp_path_factory.mktemp(name))
    return out


@pytest.mark.parametrize("stack", ["DLClusterStack", "DLEmrClusterStack"])
def test_no_failed_check_without_its_reason(failures, stack: str) -> None:
    left = [f"{check} {resource}" for check, resource in failures[stack]
            if not any(s.covers(check, resource) for s in SKIPS)]
    assert not left, "checkov findings without a skip:\n" + "\n".join(left)


def test_every_skip_is_needed_and_has_a_reason(failures) -> None:
    every = [f for fs in failures.values() for f in fs]
    for skip in SKIPS:
        assert len(skip.reason) > 40, skip
        assert any(skip.covers(check, resource) for check, resource in every), \
            f"stale skip (nothing fails it any more): {skip.check} {skip.resources}"


def test_checkov_is_live(tmp_path: Path) -> None:
    """A template that breaks a rule is reported: the scan is not silently empty."""
    bad = {"Resources": {"Open": {"Type": "AWS::S3::Bucket", "Properties": {}}}}
    assert any(check == "CKV_AWS_18" for check, _ in failed_checks(bad, tmp_path))

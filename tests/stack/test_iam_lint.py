"""Every IAM policy of both synthesized templates passes parliament (an independent IAM
linter from PyPI), except the findings listed, with the AWS page that shows them valid, in
``tests/stack/iam_lint.py`` (``ACCEPTED``)."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from tests.stack.iam_lint import ACCEPTED, FoundPolicy, findings, policies, unexplained
from tests.stack.synth import new_app


@pytest.fixture(scope="module")
def templates() -> dict[str, dict]:
    import app as app_module

    app = app_module.build_app(new_app())
    return {name: Template.from_stack(app.node.find_child(name)).to_json()  # type: ignore[arg-type]
            for name in ("DLClusterStack", "DLEmrClusterStack")}


def test_parliament_is_live() -> None:
    """A misspelt action and a wildcard resource on a resource-level API are what parliament
    exists to catch."""
    def issues(action: str) -> set[str]:
        probe = FoundPolicy("Probe.PolicyDocument", "identity", {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": action, "Resource": "*"}]})
        return {issue for issue, _detail in findings(probe)}

    assert "UNKNOWN_ACTION" in issues("s3:GetObjekt")
    assert "RESOURCE_STAR" in issues("sqs:ReceiveMessage")


def test_every_policy_of_both_stacks_is_linted(templates: dict[str, dict]) -> None:
    kinds = {name: {p.kind for p in policies(t)} for name, t in templates.items()}
    assert kinds == {"DLClusterStack": {"identity", "resource", "trust"},
                     "DLEmrClusterStack": {"identity", "resource", "trust"}}
    # No intrinsic survives resolution: parliament would read it as a malformed element.
    for t in templates.values():
        for p in policies(t):
            assert '"Fn::' not in str(p.document) and "'Ref'" not in str(p.document), p.where


@pytest.mark.parametrize("stack", ["DLClusterStack", "DLEmrClusterStack"])
def test_no_unexplained_findings(templates: dict[str, dict], stack: str) -> None:
    left, _used = unexplained(templates[stack])
    assert not left, "\n".join(left)


def test_every_acceptance_is_still_needed_and_has_a_reason(templates: dict[str, dict]) -> None:
    used: set = set()
    for t in templates.values():
        used |= unexplained(t)[1]
    assert set(ACCEPTED) == used, [a.issue for a in ACCEPTED if a not in used]
    for a in ACCEPTED:
        assert "https://docs.aws.amazon.com/" in a.reason, a

"""cdk-nag's findings on an app built without the acknowledgements: the tests that prove
the checks run and that no acknowledgement is stale (``tests/stack/test_compliance.py`` for
the EC2 cluster, ``tests/emr/test_emr_stack.py`` for EMR) read them the same way."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from cdk_nag import AwsSolutionsChecks


def nag_findings(app: cdk.App, outdir: Path) -> set[str]:
    """The AwsSolutions rules ``app`` breaks: its synth with the checks added must fail
    (``ValidationFailed``), and the report cdk-nag then writes to ``outdir`` (the app's
    output directory) names them."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((outdir / "validation-report.json").read_text())
    return {v["ruleName"] for p in report["pluginReports"] for v in p["violations"]}

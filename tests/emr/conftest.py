"""Synthesised EMR stacks shared by the EMR tests (synth is the slow part: do it once)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from stacks.emr_stack import DLEmrClusterStack, EmrSettings
from tests.conftest import REPO_ROOT

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "18,20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")


def cdk_context() -> dict:
    """cdk.json's context (feature flags): a bare App() would not see it."""
    return json.loads((Path(REPO_ROOT) / "cdk.json").read_text())["context"]


@dataclass
class Synth:
    stack: DLEmrClusterStack
    template: Template
    outdir: Path

    @property
    def resources(self) -> dict:
        return self.template.to_json()["Resources"]

    def only(self, resource_type: str) -> tuple[str, dict]:
        found = self.template.find_resources(resource_type)
        assert len(found) == 1, f"expected one {resource_type}, got {list(found)}"
        return next(iter(found.items()))

    def cluster(self) -> dict:
        return self.only("AWS::EMR::Cluster")[1]["Properties"]


def synth_stack(outdir: Path, settings: EmrSettings | None = None, *, nag: bool = True) -> Synth:
    """A full synth (cdk-nag included: findings not acknowledged raise here)."""
    app = cdk.App(context=cdk_context(), outdir=str(outdir))
    stack = DLEmrClusterStack(app, "DLEmrClusterStack", settings=settings)
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    try:
        app.synth()
    except Exception as exc:  # jsii wraps the validation failure; show the report instead
        report = outdir / "validation-report.json"
        detail = report.read_text() if report.exists() else ""
        raise AssertionError(f"synth failed: {exc}\n{detail}") from None
    template = json.loads((outdir / "DLEmrClusterStack.template.json").read_text())
    return Synth(stack, Template.from_json(template), outdir)


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """DLEmrClusterStack with no context at all (only cdk.json's feature flags)."""
    return synth_stack(tmp_path_factory.mktemp("emr-default"))


@pytest.fixture(scope="session")
def custom_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Every optional setting on: custom AMI, TLS certificates, deploy-time step, ..."""
    return synth_stack(tmp_path_factory.mktemp("emr-custom"), EmrSettings(
        ami_id="ami-0123456789abcdef0",
        tls_certificates_s3_url="s3://my-certs/emr/tls.zip",
        training_command=("python", "train.py", "--epochs", "3"),
        efs_file_system_id="fs-0123456789abcdef0",
        applications=("Hadoop", "spark", "Hue"),
        allow_unstable_applications=True,
        core_instance_count=4,
        core_instance_type="p4d.24xlarge",
        primary_instance_type="g5.2xlarge",
        root_volume_gib=200,
        key_name="ops",
        idle_timeout_minutes=120,
        data_checksums="required",
    ))

"""DLEmrClusterStack: cdk-nag, cfn-lint, the snapshot, and its context keys."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import aws_cdk as cdk
import pytest

from constructs_lib import ConfigError, EmrDeepLearningCluster
from stacks.emr_stack import EMR_CONTEXT_KEYS, EmrSettings, emr_settings_from_context
from tests.conftest import REPO_ROOT
from tests.emr.conftest import Synth, cdk_context
from tests.support.nag import nag_findings

HASH = re.compile(r"[0-9a-f]{64}")

#: What an EmrDeepLearningCluster raises before acknowledge_emr_findings (all with reasons).
EXPECTED_FINDINGS = {
    "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]",
    "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
    "AmazonEMRServicePolicy_v2]",
    "AwsSolutions-IAM5[Resource::*]",
    "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:elasticmapreduce:<AWS::Region>:"
    "<AWS::AccountId>:cluster/*]",
    "AwsSolutions-IAM5[Resource::<EmrLogBucketC96092F3.Arn>/emr-logs/*]",
    "AwsSolutions-EMR4",
    "AwsSolutions-EMR5",
    "AwsSolutions-EMR6",
}


def test_cdk_nag_passes_with_every_finding_acknowledged(default_synth: Synth,
                                                        custom_synth: Synth) -> None:
    """The fixtures synthesised with AwsSolutionsChecks: an unacknowledged finding raises."""
    for synth in (default_synth, custom_synth):
        report = synth.outdir / "validation-report.json"
        if report.exists():
            data = json.loads(report.read_text())
            assert all(p["conclusion"] == "success" for p in data["pluginReports"]), data


def test_acknowledgements_match_exactly_the_findings(tmp_path: Path) -> None:
    """Without acknowledge_emr_findings the construct raises exactly the acknowledged rules:
    none is missing and none is stale."""
    app = cdk.App(context=cdk_context(), outdir=str(tmp_path))
    EmrDeepLearningCluster(cdk.Stack(app, "Bare"), "Emr")
    assert nag_findings(app, tmp_path) == EXPECTED_FINDINGS


def cfn_lint(template: Path) -> list[dict]:
    proc = subprocess.run([str(Path(REPO_ROOT) / ".venv/bin/cfn-lint"), "--format", "json",
                           str(template)], capture_output=True, text=True, timeout=300,
                          check=False)
    return json.loads(proc.stdout or "[]")


def test_cfn_lint_reports_no_errors(default_synth: Synth, custom_synth: Synth) -> None:
    for synth in (default_synth, custom_synth):
        findings = cfn_lint(synth.outdir / "DLEmrClusterStack.template.json")
        errors = [f for f in findings if f["Level"] == "Error"]
        assert errors == []
        # Warnings only on what CDK generates itself (the default-SG custom resource, and
        # the DependsOn on its role that aws-lambda's Function always adds).
        ours = [f for f in findings if "CustomVpcRestrictDefaultSG" not in json.dumps(f)
                and not (f["Rule"]["Id"] == "W3005"
                         and "/Properties/Role'" in f["Message"])]
        assert ours == []


def test_snapshot(default_synth: Synth, snapshot) -> None:
    """One snapshot of the whole template, asset hashes masked so CDK upgrades do not churn
    it; the fine-grained assertions live in test_emr_construct.py."""
    masked = json.loads(HASH.sub("<hash>", json.dumps(default_synth.template.to_json())))
    assert json.dumps(_sorted_resources(masked), indent=1, sort_keys=True) == snapshot


def _sorted_resources(node: object) -> object:
    """IAM statement Resource lists come out ordered by value (minimizePolicies), i.e. by
    asset hash: sort them after masking so editing a script does not reorder the snapshot."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            value = _sorted_resources(value)
            if key == "Resource" and isinstance(value, list):
                value = sorted(value, key=json.dumps)
            out[key] = value
        return out
    if isinstance(node, list):
        return [_sorted_resources(v) for v in node]
    return node


def test_outputs_tell_how_to_submit_and_connect(default_synth: Synth) -> None:
    outputs = default_synth.template.to_json()["Outputs"]
    assert outputs["ClusterId"]["Value"] == {"Ref": "EmrCluster58CC5E16"}
    submit = json.dumps(outputs["SubmitCommand"]["Value"])
    assert "dl-submit --emr " in submit and "--wait -- python train.py" in submit
    connect = json.dumps(outputs["ConnectCommand"]["Value"])
    assert "aws ssm start-session" in connect and "--instance-group-types MASTER" in connect


# -- context keys -------------------------------------------------------------------------------


def test_no_context_gives_the_defaults() -> None:
    assert emr_settings_from_context(lambda _key: None) == EmrSettings()


def test_context_values_arrive_as_strings_from_the_command_line() -> None:
    ctx = {
        "emrCoreInstanceCount": "4", "emrRootVolumeGiB": "150", "emrApplications": "Hadoop,Spark",
        "emrAllowUnstableApplications": "false", "emrAmiId": "ami-0123456789abcdef0",
        "emrTrainingCommand": "python train.py --epochs '3'", "emrIdleTimeoutMinutes": "60",
        "emrEfsFileSystemId": "fs-0123456789abcdef0", "emrCoreInstanceType": "p5.48xlarge",
        "emrTlsCertificatesS3Url": "s3://certs/tls.zip", "emrReleaseLabel": "emr-7.14.0",
        "emrVpcId": "vpc-0123456789abcdef0", "emrAvailabilityZones": "us-east-1a,us-east-1b",
        "emrVpcPrivateSubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
        "emrDataChecksums": "required",
    }
    s = emr_settings_from_context(ctx.get)
    assert s.core_instance_count == 4 and s.root_volume_gib == 150
    assert s.applications == ("Hadoop", "Spark")
    assert s.training_command == ("python", "train.py", "--epochs", "3")
    assert s.idle_timeout_minutes == 60 and s.ami_id == "ami-0123456789abcdef0"
    assert s.core_instance_type == "p5.48xlarge" and s.release_label == "emr-7.14.0"
    assert s.data_checksums == "required"
    # JSON from cdk.json works too.
    assert emr_settings_from_context({"emrApplications": ["Spark"]}.get).applications == (
        "Spark",)


@pytest.mark.parametrize(("ctx", "pattern"), [
    ({"emrRootVolumeGiB": "20"}, r"context key 'emrRootVolumeGiB' must be at least 50 GiB"),
    ({"emrCoreInstanceCount": "two"}, r"context key 'emrCoreInstanceCount' must be an integer"),
    ({"emrAmiId": "img-1"}, r"context key 'emrAmiId' must look like ami-"),
    ({"emrAllowUnstableApplications": "maybe"},
     r"context key 'emrAllowUnstableApplications' must be true or false, got 'maybe'"),
    ({"emrTrainingCommand": "python 'unclosed"}, r"'emrTrainingCommand' is not a valid command"),
    ({"emrDataChecksums": "strict"},
     r"^context key 'emrDataChecksums' must be one of warn, required, got 'strict'$"),
])
def test_bad_context_values_name_the_key(ctx: dict, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        emr_settings_from_context(ctx.get)


def test_every_context_key_maps_to_a_setting_and_is_documented() -> None:
    fields = set(EmrSettings.__dataclass_fields__)
    docs = (Path(REPO_ROOT) / "docs" / "emr.md").read_text()
    for key, field in EMR_CONTEXT_KEYS.items():
        assert field in fields
        assert f"`{key}`" in docs, f"docs/emr.md does not document {key}"


def test_settings_defaults_are_the_constructs_own() -> None:
    """EmrSettings restates no default: an unset key means the construct's default."""
    import inspect

    props = inspect.signature(EmrDeepLearningCluster.__init__).parameters
    s = EmrSettings()
    for field in ("release_label", "applications", "allow_unstable_applications",
                  "primary_instance_type", "core_instance_type", "core_instance_count",
                  "root_volume_gib", "efs_mount_point", "vpc_cidr",
                  "tls_certificates_s3_url", "data_checksums"):
        assert getattr(s, field) == props[field].default, field
    assert s.idle_timeout_minutes is props["idle_timeout"].default
    assert s.training_command is props["training_command"].default


# -- an existing VPC (emrVpcId), which an existing file system needs ---------------------------
EXISTING_VPC = {"emrVpcId": "vpc-0123456789abcdef0",
                "emrAvailabilityZones": "us-east-1a,us-east-1b",
                "emrVpcPrivateSubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1"}


@pytest.mark.parametrize(("ctx", "words"), [
    ({"emrEfsFileSystemId": "fs-0123456789abcdef0"},
     ["'emrEfsFileSystemId' needs 'emrVpcId'", "fs-0123456789abcdef0"]),
    ({"emrVpcPrivateSubnetIds": "subnet-0123456789abcdef0"},
     ["'emrVpcPrivateSubnetIds' is for an existing VPC"]),
    ({"emrVpcId": "vpc-0123456789abcdef0"},
     ["'emrVpcId' needs 'emrVpcPrivateSubnetIds' and 'emrAvailabilityZones'"]),
    ({**EXISTING_VPC, "emrVpcCidr": "10.1.0.0/16"},
     ["'emrVpcCidr' is the CIDR of a new VPC", "10.1.0.0/16"]),
    ({**EXISTING_VPC, "emrAvailabilityZones": "us-east-1a"},
     ["one subnet per zone", "us-east-1a"]),
])
def test_existing_vpc_rules_name_the_keys(ctx: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        emr_settings_from_context(ctx.get)
    for word in words:
        assert word in str(err.value)


def test_an_existing_file_system_runs_in_the_existing_vpc(tmp_path: Path) -> None:
    from tests.emr.conftest import synth_stack

    s = emr_settings_from_context({**EXISTING_VPC,
                                   "emrEfsFileSystemId": "fs-0123456789abcdef0"}.get)
    synth = synth_stack(tmp_path, s)
    assert not [k for k in synth.resources if synth.resources[k]["Type"] == "AWS::EC2::VPC"]
    assert not [r for r in synth.resources.values() if r["Type"] == "AWS::EFS::FileSystem"]
    instances = synth.cluster()["Instances"]
    assert instances["Ec2SubnetId"] == "subnet-0123456789abcdef0"
    groups = [r["Properties"] for r in synth.resources.values()
              if r["Type"] == "AWS::EC2::SecurityGroup"]
    assert groups and all(g["VpcId"] == "vpc-0123456789abcdef0" for g in groups)

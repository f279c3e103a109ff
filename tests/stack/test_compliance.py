"""cdk-nag (AwsSolutions) and cfn-lint over every synthesized template of the app."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stack.synth import REPO, new_app

CONTEXTS = {
    "default": {},
    "ssh-efs-placement": {
        "sshCidr": "203.0.113.7/32",
        "efsFileSystemId": "fs-0123abcd",
        "vpcId": "vpc-0123456789abcdef0",
        "vpcPrivateSubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
        "vpcPublicSubnetIds": "subnet-0123456789abcdef2,subnet-0123456789abcdef3",
        "availabilityZones": "us-east-1a,us-east-1b",
        "placementGroup": "true",
        "keyName": "ops",
        "warmPoolSize": "2",  # the warm pool, its launch hook and the workers' grant
        "maxWorkers": "4",
        "scheduler": "slurm",  # the munge key's secret, its key and the node roles' grant
    },
    "elastic-spot": {"spotWorkers": "2", "maxWorkers": "6", "dataPrepScript": "/efs/prep.sh",
                     "budgetPerDay": "250",
                     "clusterUsers": "alice,bob",  # the per-user Command documents
                     # FSx for Lustre beside EFS, linked to the data bucket
                     "sharedStorage": "fsx-lustre", "dataBucket": "my-datasets"},
}


@pytest.fixture(scope="module", params=sorted(CONTEXTS))
def assembly(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import app as app_module

    out = tmp_path_factory.mktemp(f"cdk.out.{request.param}")
    app = app_module.build_app(new_app(outdir=str(out), **CONTEXTS[request.param]))
    app.synth()  # raises if any AwsSolutions finding is not acknowledged
    return out


def test_cdk_nag_has_no_unacknowledged_findings(assembly: Path) -> None:
    report = json.loads((assembly / "validation-report.json").read_text())
    failures = [
        v["ruleName"]
        for plugin in report["pluginReports"]
        for v in plugin.get("violations", [])
        if v.get("severity") == "error"
    ]
    assert not failures


def test_cdk_nag_is_live_and_acknowledgements_are_exactly_what_clears_it(tmp_path: Path) -> None:
    """Without our acknowledgements the same cluster fails synth with exactly the findings we
    acknowledge: proves the checks run, and that no acknowledgement is stale."""
    import aws_cdk as cdk

    from constructs_lib import DeepLearningCluster
    from tests.support.nag import nag_findings

    app = new_app(outdir=str(tmp_path))
    DeepLearningCluster(cdk.Stack(app, "Raw"), "Cluster")
    found = nag_findings(app, tmp_path)
    text = (
        (REPO / "constructs_lib" / "nag_suppressions.py").read_text().replace('"\n         "', "")
    )
    assert found, "cdk-nag reported nothing: is the plugin registered?"
    for rule in found:
        bare = rule.removeprefix("Annotation::").split("[")[0]
        assert bare in text, f"unexpected finding {rule}"
    # 6, plus the operator policy's instance/* (tag-conditioned) and own-session wildcards,
    # and the staging bucket's workdirs/* (operators put, the master gets)
    # plus the checkpoint prefix's objects (constructs_lib/training_data.py)
    # plus the job role's per-user checkpoint prefix (constructs_lib/job_role.py)
    # plus the operators' own workdirs/<dl-user>/* (constructs_lib/workdir_staging.py)
    # plus the node-keys queue without a dead-letter queue (constructs_lib/node_keys.py)
    assert len(found) <= 13, sorted(found)


def test_every_acknowledgement_has_a_reason_and_lives_in_one_file() -> None:
    text = (REPO / "constructs_lib" / "nag_suppressions.py").read_text()
    assert "Acknowledgment(id=rule, reason=reason)" in text
    offenders = [
        p
        for p in REPO.glob("**/*.py")
        if ".venv" not in p.parts
        and "tests" not in p.parts
        and p.name != "nag_suppressions.py"
        and ".acknowledge(" in p.read_text()
    ]
    assert not offenders, offenders


def test_cfn_lint_has_no_errors(assembly: Path) -> None:
    templates = sorted(assembly.glob("*.template.json"))
    assert templates
    # W3005 (redundant DependsOn) comes from CDK's own dependency rendering.
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "cfn-lint"),
            "--ignore-checks",
            "W3005",
            "--",
            *map(str, templates),
        ],
        capture_output=True,
        text=True,
    )
    errors = [line for line in proc.stdout.splitlines() if line[:1] == "E"]
    assert not errors, proc.stdout
    assert proc.returncode in (0, 4, 8, 12), proc.stdout + proc.stderr  # warnings/info only

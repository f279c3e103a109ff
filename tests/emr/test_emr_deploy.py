"""``cdk deploy DLEmrClusterStack`` with the real CDK CLI against moto's server.

What moto's CloudFormation does with AWS::EMR::Cluster (moto 5.2.5) is recorded here so the
gaps are explicit: it creates the cluster with its name, release label, custom AMI, log URI,
roles, subnet, security groups and tags, but drops the instance groups, bootstrap actions,
steps, applications and security configuration (its ``create_from_cloudformation_json``
never reads them), so the deployed cluster has no instances. The membership logic is
therefore tested on a ``run_job_flow`` cluster (test_emr_metadata.py); the deployed
cluster still takes a ``dl-submit`` step.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.emr import submit
from emulator.deploy import run_cli
from tests.conftest import REGION, REPO_ROOT

ACCOUNT = "123456789012"
STACK = "DLEmrClusterStack"

pytestmark = pytest.mark.slow


def cli_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AWS_PROFILE"}
    env.update({
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "18,20",
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
        "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1",
        "CDK_DISABLE_VERSION_CHECK": "1", "CDK_CLI_NOTICES": "false", "CI": "true",
    })
    env["PATH"] = str(Path(REPO_ROOT) / ".venv" / "bin") + os.pathsep + env.get("PATH", "")
    return env


@pytest.fixture()
def deployed(moto_reset: str, tmp_path: Path) -> dict:
    env = cli_env(moto_reset)
    log = tmp_path / "cdk.log"
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_reset)
    ami = sorted(ec2.describe_images(Owners=["amazon"])["Images"],
                 key=lambda i: i["ImageId"])[0]["ImageId"]
    out = tmp_path / "cdk.out"
    # the emulator's own CLI runner: one way to drive `npx cdk`, group-killed on overrun
    bootstrap_s = run_cli(["bootstrap", f"aws://{ACCOUNT}/{REGION}", "--output", str(out)],
                          env=env, log=log, what="cdk bootstrap", timeout=900)
    deploy_s = run_cli(["deploy", STACK, "--require-approval", "never", "--progress", "events",
                        "--output", str(out), "-c", f"emrAmiId={ami}",
                        "-c", "emrTrainingCommand=python train.py"],
                       env=env, log=log, what=f"cdk deploy {STACK}", timeout=900)
    print(f"\n[figures] cdk bootstrap {bootstrap_s:.1f}s, cdk deploy {STACK} {deploy_s:.1f}s")
    return {"endpoint": moto_reset, "ami": ami, "log": log, "out": out}


def test_cdk_deploy_creates_the_emr_cluster_in_moto(deployed: dict) -> None:
    endpoint = deployed["endpoint"]
    cfn = boto3.client("cloudformation", region_name=REGION, endpoint_url=endpoint)
    stack = cfn.describe_stacks(StackName=STACK)["Stacks"][0]
    assert stack["StackStatus"] == "CREATE_COMPLETE"
    # moto returned no Outputs in DescribeStacks after the CLI's change-set deploy, so the
    # cluster id comes from the stack's resources.
    resources = cfn.list_stack_resources(StackName=STACK)["StackResourceSummaries"]
    by_type: dict[str, list[str]] = {}
    for r in resources:
        by_type.setdefault(r["ResourceType"], []).append(r["PhysicalResourceId"])
    (cluster_id,) = by_type["AWS::EMR::Cluster"]
    assert cluster_id.startswith("j-")
    assert {"AWS::EMR::SecurityConfiguration", "AWS::EFS::FileSystem", "AWS::KMS::Key",
            "AWS::IAM::InstanceProfile", "AWS::S3::Bucket", "AWS::EC2::VPC"} <= set(by_type)
    print(f"[figures] {len(resources)} resources deployed")

    emr = boto3.client("emr", region_name=REGION, endpoint_url=endpoint)
    cluster = emr.describe_cluster(ClusterId=cluster_id)["Cluster"]
    assert cluster["Name"] == STACK
    assert cluster["ReleaseLabel"].startswith("emr-7.")
    assert cluster["CustomAmiId"] == deployed["ami"]
    assert cluster["LogUri"].endswith("/emr-logs/")
    assert {"Key": "dl-cluster:id", "Value": STACK} in cluster["Tags"]
    attrs = cluster["Ec2InstanceAttributes"]
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
    subnet = ec2.describe_subnets(SubnetIds=[attrs["Ec2SubnetId"]])["Subnets"][0]
    assert subnet["MapPublicIpOnLaunch"] is False  # a private subnet
    assert attrs["AdditionalMasterSecurityGroups"] == attrs["AdditionalSlaveSecurityGroups"]
    assert len(attrs["AdditionalMasterSecurityGroups"]) == 1  # the EFS group
    (sc_name,) = by_type["AWS::EMR::SecurityConfiguration"]
    doc = emr.describe_security_configuration(Name=sc_name)["SecurityConfiguration"]
    # moto returns the document as Python repr (single quotes) when it came from a
    # CloudFormation object rather than a JSON string: another moto gap.
    doc = ast.literal_eval(doc) if isinstance(doc, str) and doc.startswith("{'") else (
        json.loads(doc) if isinstance(doc, str) else doc)
    assert doc["EncryptionConfiguration"]["EnableAtRestEncryption"] is True

    # The bootstrap scripts were published where the bootstrap actions point.
    template = json.loads((deployed["out"] / f"{STACK}.template.json").read_text())
    cluster_props = next(r for r in template["Resources"].values()
                         if r["Type"] == "AWS::EMR::Cluster")["Properties"]
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=endpoint)
    for action in cluster_props["BootstrapActions"]:
        url = action["ScriptBootstrapAction"]["Path"]["Fn::Sub"].replace(
            "${AWS::AccountId}", ACCOUNT).replace("${AWS::Region}", REGION)
        bucket, key = url.removeprefix("s3://").split("/", 1)
        assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] > 0

    # moto's gaps (see the module docstring): asserted so a moto upgrade that closes them
    # shows up here and the tests can then use the deployed cluster directly.
    assert emr.list_instances(ClusterId=cluster_id)["Instances"] == []
    assert emr.list_bootstrap_actions(ClusterId=cluster_id)["BootstrapActions"] == []
    assert emr.list_steps(ClusterId=cluster_id)["Steps"] == []  # the deploy-time step too

    # dl-submit against the deployed cluster.
    step_id = submit.submit(emr, cluster_id, submit.dl_run_step(["python", "train.py"]))
    steps = emr.list_steps(ClusterId=cluster_id)["Steps"]
    assert [s["Id"] for s in steps] == [step_id]
    assert steps[0]["Config"]["Args"] == ["/usr/local/bin/dl-run", "python", "train.py"]

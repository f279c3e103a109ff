"""docs/constructs.md's example (linked from the README), synthesized exactly as written and
as a user without AWS credentials runs it (no ``CDK_DEFAULT_*`` variables), so the page cannot
drift."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from tests.stack.synth import REPO

SECTION = "## Use the constructs in your own CDK app"
#: The existing-VPC variant the example describes in a comment.
LOOKUP = re.compile(r"# .*vpc=ec2\.Vpc\.from_lookup\(stack, \"Vpc\", vpc_id=\"vpc-[0-9a-f]+\"\)")


def readme_example() -> str:
    text = (REPO / "docs" / "constructs.md").read_text()
    section = text[text.index(SECTION):]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_example_synthesizes(monkeypatch: pytest.MonkeyPatch) -> None:
    code = readme_example()
    assert LOOKUP.search(code), "the README example no longer says how to use an existing VPC"
    # What the CDK CLI sets only when it finds credentials: a new user may have none.
    for name in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION", "AWS_REGION",
                 "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    namespace: dict = {}
    exec(compile(code, "docs/constructs.md", "exec"), namespace)

    template = Template.from_stack(namespace["stack"])
    workers = namespace["cluster"].worker_group
    assert workers.auto_scaling_group.node.path == "Training/Cluster/WorkerGroup/Group"
    data = [lt["Properties"]["LaunchTemplateData"]
            for lt in template.find_resources("AWS::EC2::LaunchTemplate").values()]
    assert [d["InstanceType"] for d in data] == ["p4d.24xlarge", "p4d.24xlarge"]
    for d in data:
        assert d["NetworkInterfaces"][0]["InterfaceType"] == "efa"
        assert d["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 500
        assert d["BlockDeviceMappings"][0]["DeviceName"] == "/dev/xvda"  # amazon-linux-2023
    template.resource_count_is("AWS::EC2::PlacementGroup", 2)  # one per zone (zone fallback)
    template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {
        "DesiredCapacity": "8"})
    assert '"FromPort": 6006' in json.dumps(template.to_json())
    outdir = Path(namespace["app"].outdir)
    assert (outdir / "Training.template.json").exists()  # app.synth() ran
    shutil.rmtree(outdir, ignore_errors=True)

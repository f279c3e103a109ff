"""``allowedImages``, the stack's side: the list reaches every node's installer, and the node
roles may pull from exactly the ECR repositories it names (nothing of ECR without it)."""

from __future__ import annotations

import json

import pytest

from constructs_lib.allowed_images import check_allowed_images, ecr_repository_arns
from constructs_lib.validation import ConfigError
from tests.stack.synth import cluster_template

ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"


def ecr_statements(template) -> list[dict]:
    found = []
    for policy in template.find_resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"]
            actions = [actions] if isinstance(actions, str) else actions
            if any(a.startswith("ecr:") for a in actions):
                found.append(statement)
    return found


def test_no_setting_no_ecr_and_no_list_on_the_nodes():
    template = cluster_template()
    assert ecr_statements(template) == []
    assert "--allowed-images" not in json.dumps(
        template.find_resources("AWS::EC2::LaunchTemplate"))


def test_the_list_reaches_the_nodes_and_the_roles_pull_only_the_ecr_ones():
    template = cluster_template(allowedImages=f"{ECR}/team, nvcr.io/nvidia")
    launch = json.dumps(template.find_resources("AWS::EC2::LaunchTemplate"))
    assert launch.count(f"--allowed-images '{ECR}/team,nvcr.io/nvidia'") == 2  # both groups
    statements = ecr_statements(template)
    pulls = [s for s in statements if "ecr:BatchGetImage" in s["Action"]]
    tokens = [s for s in statements if s["Action"] == "ecr:GetAuthorizationToken"]
    assert len(pulls) == 2 and len(tokens) == 2  # the master's role and the workers'
    for statement in pulls:
        assert sorted(statement["Action"]) == ["ecr:BatchCheckLayerAvailability",
                                               "ecr:BatchGetImage",
                                               "ecr:GetDownloadUrlForLayer"]
        text = json.dumps(statement["Resource"])
        assert ":ecr:us-east-1:123456789012:repository/team" in text
        assert ":repository/team/*" in text
        assert "nvcr" not in text


def test_arns_of_registry_and_prefix_entries():
    assert ecr_repository_arns(["nvcr.io/nvidia"]) == []
    (whole,) = ecr_repository_arns([ECR])
    assert whole.endswith(":ecr:us-east-1:123456789012:repository/*")


@pytest.mark.parametrize("bad", ["https://nvcr.io/nvidia", "nvcr.io/NVIDIA", "nvcr.io/a:tag",
                                 "nvcr.io/*"])
def test_a_bad_entry_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match="allowedImages"):
        check_allowed_images("allowedImages", f"nvcr.io/ok, {bad}")

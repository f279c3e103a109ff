"""Workers cannot speak for the master (synthesized template): the membership key signs for
the master's role alone, every node may only verify; no node role may assume or pass
another role; and the workers have no action on the master queue (L9's test).
The node side (a worker-written membership is not applied): tests/security/
test_node_membership_signature.py."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from tests.stack.synth import cluster_template


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template()


def statements(t: Template, policy_fragment: str) -> list[dict]:
    found = [p for k, p in t.find_resources("AWS::IAM::Policy").items() if policy_fragment in k]
    assert len(found) == 1, policy_fragment
    return found[0]["Properties"]["PolicyDocument"]["Statement"]


def actions(st: dict) -> list[str]:
    return st["Action"] if isinstance(st["Action"], list) else [st["Action"]]


def key_id(t: Template) -> str:
    (key,) = [k for k, r in t.find_resources("AWS::KMS::Key").items()
              if r["Properties"].get("KeyUsage") == "SIGN_VERIFY"]
    return key


def kms_actions_on_key(t: Template, policy_fragment: str) -> set[str]:
    key = {"Fn::GetAtt": [key_id(t), "Arn"]}
    out: set[str] = set()
    for st in statements(t, policy_fragment):
        res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        if key in res or "*" in res:
            out |= {a for a in actions(st) if a.startswith("kms:")}
    return out


def test_the_membership_key_is_an_asymmetric_signing_key(template: Template) -> None:
    props = template.find_resources("AWS::KMS::Key")[key_id(template)]["Properties"]
    assert (props["KeySpec"], props["KeyUsage"]) == ("ECC_NIST_P256", "SIGN_VERIFY")


def test_only_the_master_signs_the_membership_every_node_verifies(template: Template) -> None:
    """Every node verifies locally with the key's public half (kms:GetPublicKey, once per
    agent); none calls kms:Verify, so none is granted it."""
    assert kms_actions_on_key(template, "MasterGroupInstanceRoleDefaultPolicy") == {
        "kms:Sign", "kms:GetPublicKey"}
    assert kms_actions_on_key(template, "WorkerGroupInstanceRoleDefaultPolicy") == {
        "kms:GetPublicKey"}


def test_both_roles_get_the_key_in_their_user_data(template: Template) -> None:
    key = key_id(template)
    for group in ("MasterGroup", "WorkerGroup"):
        (lt,) = [r for k, r in template.find_resources("AWS::EC2::LaunchTemplate").items()
                 if group in k]
        assert f"'{key}'" in str(lt["Properties"]["LaunchTemplateData"]["UserData"]) or \
            key in str(lt["Properties"]["LaunchTemplateData"]["UserData"]), group


@pytest.mark.parametrize("role", ["MasterGroupInstanceRoleDefaultPolicy",
                                  "WorkerGroupInstanceRoleDefaultPolicy"])
def test_no_node_role_may_assume_or_pass_a_role(template: Template, role: str) -> None:
    """A worker cannot become the master (nor the master anything else) through IAM: the
    only role a node may assume is the job role (for its jobs' credentials), nothing of
    iam:."""
    (job_role,) = [k for k in template.find_resources("AWS::IAM::Role") if "JobRole" in k]
    for st in statements(template, role):
        for action in actions(st):
            if action.lower().startswith("sts:"):
                assert sorted(actions(st)) == ["sts:AssumeRole", "sts:TagSession"], (role, st)
                assert st["Resource"] == {"Fn::GetAtt": [job_role, "Arn"]}, (role, st)
                continue
            assert not action.lower().startswith("iam:"), (role, st)


def test_only_ec2_may_assume_the_node_roles(template: Template) -> None:
    """The master's role is assumed by its instances only: no worker (no principal of the
    account) is trusted to assume it."""
    roles = {k: r for k, r in template.find_resources("AWS::IAM::Role").items()
             if "GroupInstanceRole" in k}
    assert len(roles) == 2, sorted(roles)
    for name, role in roles.items():
        trust = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert [st["Principal"] for st in trust] == [{"Service": "ec2.amazonaws.com"}], name


def test_every_node_installs_the_pinned_cryptography_that_checks_signatures(
        template: Template) -> None:
    """The node agents check signatures locally with ``cryptography``: the user data of every
    node group installs it (a failed install fails the bootstrap: no ``|| echo``), at the pin
    of requirements.txt, which is what the emulated nodes import."""
    from pathlib import Path

    from constructs_lib.user_data import CRYPTOGRAPHY_REQUIREMENT

    pins = (Path(__file__).resolve().parents[2] / "requirements.txt").read_text().split()
    assert CRYPTOGRAPHY_REQUIREMENT in pins
    templates = [r["Properties"]["LaunchTemplateData"]["UserData"]
                 for r in template.find_resources("AWS::EC2::LaunchTemplate").values()]
    assert len(templates) >= 2
    for user_data in templates:
        text = str(user_data)
        assert f"pip install -q {CRYPTOGRAPHY_REQUIREMENT}" in text
        assert f"{CRYPTOGRAPHY_REQUIREMENT} ||" not in text

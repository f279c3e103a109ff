"""The master's idle stop in the stack (``idleStopMasterMinutes``): the master's controller
gets the setting in seconds and the capacity adjuster's function name, the master's role
may invoke that function (which releases the group) and nothing more for it, and the
operator policy may set the master group, and only it, back to one (``dlc`` wakes it)."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from constructs_lib.idle_stop import NOT_SIZES
from constructs_lib.validation import ConfigError
from tests.stack.synth import cluster_template


def master_user_data(t: Template) -> str:
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
        text = "".join(p if isinstance(p, str) else "<token>" for p in parts)
        if "--role 'master'" in text:
            return text
    raise AssertionError("no master launch template")


def statements(t: Template, kind: str) -> list[tuple[str, dict]]:
    """(the policy's logical id, statement) of every policy of ``kind``."""
    return [(lid, s) for lid, p in t.find_resources(kind).items()
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def invoke_grants(t: Template) -> list[tuple[str, dict]]:
    return [(lid, s) for lid, s in statements(t, "AWS::IAM::Policy")
            if "lambda:InvokeFunction" in (s["Action"] if isinstance(s["Action"], list)
                                           else [s["Action"]])]


def master_policy_ids(t: Template) -> set[str]:
    roles = {lid for lid, r in t.find_resources("AWS::IAM::Role").items()
             if "MasterGroup" in lid}
    return {lid for lid, p in t.find_resources("AWS::IAM::Policy").items()
            if any(r.get("Ref") in roles for r in p["Properties"].get("Roles", []))}


def wake_statements(t: Template) -> list[dict]:
    return [s for _, s in statements(t, "AWS::IAM::ManagedPolicy")
            if s.get("Sid") == "WakeThisClustersMaster"]


@pytest.fixture(scope="module")
def default() -> Template:
    return cluster_template()


def test_the_default_is_an_hour_after_the_workers_with_the_function_named(default) -> None:
    text = master_user_data(default)
    assert "--idle-stop-master-seconds '3600'" in text
    assert "--release-function <token>" in text or "--release-function '<token>'" in text


def test_the_master_may_invoke_the_adjuster_and_only_the_master(default) -> None:
    grants = invoke_grants(default)
    masters = master_policy_ids(default)
    assert grants and {lid for lid, _ in grants} <= masters, grants
    functions = default.find_resources("AWS::Lambda::Function")
    adjuster = [lid for lid in functions if "CapacityAdjuster" in lid]
    for _, s in grants:
        text = str(s["Resource"])
        assert any(lid in text for lid in adjuster), s


def test_the_operator_may_set_the_master_group_to_one_and_nothing_else(default) -> None:
    (s,) = wake_statements(default)
    assert s["Action"] == "autoscaling:UpdateAutoScalingGroup" and s["Effect"] == "Allow"
    cond = s["Condition"]
    assert cond["StringEquals"] == {"autoscaling:ResourceTag/dl-cluster:id": "DLClusterStack",
                                    "autoscaling:ResourceTag/NodeType": "Master"}
    assert cond["NumericLessThanEquals"] == {"autoscaling:MinSize": "1",
                                             "autoscaling:MaxSize": "1"}
    assert cond["Null"] == {key: "true" for key in NOT_SIZES}


@pytest.mark.parametrize("context", [{"idleStopMasterMinutes": "0"},
                                     {"idleStopMinutes": "0"}])
def test_off_or_without_the_workers_stop_grants_nothing(context: dict) -> None:
    t = cluster_template(**context)
    assert "--idle-stop-master-seconds" not in master_user_data(t)
    assert invoke_grants(t) == [] and wake_statements(t) == []


def test_out_of_bounds_names_the_key_and_value() -> None:
    with pytest.raises(ConfigError, match=r"idleStopMasterMinutes.*10081"):
        cluster_template(idleStopMasterMinutes="10081")

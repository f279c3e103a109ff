"""``warmPoolSize``: the worker group's Stopped warm pool, its launch hook, the master's
grant to complete the workers' launch actions (the workers may only send on the warm-ready
queue), the agents' options, and the restrictions AWS documents refused at synth with the
key and the value (constructs_lib/warm_pool.py). Without the setting nothing changes: the
default template is pinned by tests/stack/test_snapshot.py (no ``AWS::AutoScaling::WarmPool``,
one lifecycle hook, no ``--launch-hook``)."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match

from constructs_lib import validation
from constructs_lib.warm_pool import WARM_HOOK_NAME
from stacks.settings import settings_from_context
from tests.stack.checkov_skips import SKIPS, checkov_binary, failed_checks
from tests.stack.synth import cluster_template


def _settings(**ctx: str):
    return settings_from_context(ctx.get)


@pytest.fixture(scope="module")
def warm():
    return cluster_template(warmPoolSize="2", maxWorkers="4")


def test_the_worker_group_gets_a_stopped_pool_of_that_size(warm) -> None:
    pools = warm.find_resources("AWS::AutoScaling::WarmPool")
    assert len(pools) == 1
    (pool,) = pools.values()
    props = pool["Properties"]
    assert props["MinSize"] == 2 and props["MaxGroupPreparedCapacity"] == 2
    assert props["PoolState"] == "Stopped"
    assert props.get("InstanceReusePolicy", {"ReuseOnScaleIn": False}) == {
        "ReuseOnScaleIn": False}
    groups = warm.find_resources("AWS::AutoScaling::AutoScalingGroup")
    worker = [lid for lid, g in groups.items() if any(
        t["Key"] == "NodeType" and t["Value"] == "Worker" for t in g["Properties"]["Tags"])]
    assert props["AutoScalingGroupName"] == {"Ref": worker[0]}
    # created after the launch hook: no pool instance is stopped before it is prepared
    hooks = warm.find_resources("AWS::AutoScaling::LifecycleHook", {
        "Properties": {"LifecycleHookName": WARM_HOOK_NAME}})
    assert len(hooks) == 1 and set(hooks) <= set(pool.get("DependsOn", []))


def test_a_launch_hook_holds_warmed_instances_until_the_agent_completes_it(warm) -> None:
    warm.has_resource_properties("AWS::AutoScaling::LifecycleHook", {
        "LifecycleHookName": WARM_HOOK_NAME,
        "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
        "DefaultResult": "ABANDON",
        "HeartbeatTimeout": 900,  # the node boot budget (nodeBootSeconds)
        "NotificationTargetARN": Match.absent(),
    })


def _statements(template, role_word: str) -> list[dict]:
    """Every statement of the policies attached to the node role whose logical id has
    ``role_word`` (Master / Worker)."""
    out = []
    for p in template.find_resources("AWS::IAM::Policy").values():
        roles = json.dumps(p["Properties"].get("Roles", []))
        if role_word in roles:
            out.extend(p["Properties"]["PolicyDocument"]["Statement"])
    return out


def _actions(statement: dict) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else list(action)


def test_only_the_master_may_complete_the_worker_groups_launch_actions(warm) -> None:
    """A worker cannot complete any launch action (AWS has no condition tying one to the
    calling instance); the master may, on this cluster's worker group only."""
    worker = [s for s in _statements(warm, "WorkerGroup")
              if any(a.startswith("autoscaling:CompleteLifecycleAction") or a == "autoscaling:*"
                     for a in _actions(s))]
    assert worker == []
    master = [s for s in _statements(warm, "MasterGroup")
              if s.get("Sid") == "CompleteWorkersLaunchHook"]
    assert len(master) == 1
    (statement,) = master
    assert statement["Action"] == "autoscaling:CompleteLifecycleAction"
    condition = statement["Condition"]["StringEquals"]
    assert condition["autoscaling:ResourceTag/NodeType"] == "Worker"
    assert "autoscaling:ResourceTag/dl-cluster:id" in condition


def test_workers_may_only_send_on_the_warm_ready_queue_and_the_master_consumes_it(warm) -> None:
    queues = warm.find_resources("AWS::SQS::Queue")
    ready = [lid for lid in queues if "WarmReady" in lid]
    assert len(ready) == 1
    (lid,) = ready
    assert queues[lid]["Properties"]["SqsManagedSseEnabled"] is True

    def on_queue(role_word: str) -> set[str]:
        return {a for s in _statements(warm, role_word)
                if lid in json.dumps(s.get("Resource")) for a in _actions(s)}

    worker = on_queue("WorkerGroup")
    assert "sqs:SendMessage" in worker
    assert not {a for a in worker if a.startswith(("sqs:Receive", "sqs:Delete", "sqs:Change"))}
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessage"} <= on_queue("MasterGroup")


def test_the_master_knows_the_workers_role_and_the_queue(warm) -> None:
    templates = warm.find_resources("AWS::EC2::LaunchTemplate")
    master = [json.dumps(t) for lid, t in templates.items() if "Master" in lid]
    assert len(master) == 1
    assert "--worker-role-id" in master[0] and "RoleId" in master[0]
    assert "--warm-ready-queue-url" in master[0]


def test_workers_user_data_names_the_hook_and_the_queue(warm) -> None:
    templates = warm.find_resources("AWS::EC2::LaunchTemplate")
    worker = [json.dumps(t) for lid, t in templates.items() if "Worker" in lid]
    assert len(worker) == 1
    assert f"--launch-hook {WARM_HOOK_NAME}" in worker[0] or \
        f"--launch-hook '{WARM_HOOK_NAME}'" in worker[0]
    assert "--warm-ready-queue-url" in worker[0] and "--worker-role-id" not in worker[0]


@pytest.mark.parametrize(("ctx", "message"), [
    ({"warmPoolSize": "1", "spotWorkers": "1"},
     "context key 'warmPoolSize' (1) cannot be used with 'spotWorkers' (1)"),
    ({"warmPoolSize": "2", "workerInstanceTypes": "p5.48xlarge,p4d.24xlarge"},
     "context key 'warmPoolSize' (2) cannot be used with 'workerInstanceTypes' "
     "(p5.48xlarge,p4d.24xlarge)"),
    ({"warmPoolSize": "1", "capacityBlockId": "cr-0123456789abcdef0"},
     "context key 'warmPoolSize' (1) cannot be used with 'capacityBlockId' "
     "(cr-0123456789abcdef0)"),
    ({"warmPoolSize": "-1"}, "'warmPoolSize'"),
    ({"warmPoolSize": "1001"}, "context key 'warmPoolSize' must be at most 1000"),
    ({"warmPoolSize": "two"}, "'warmPoolSize'"),
])
def test_what_aws_refuses_is_refused_at_synth_naming_key_and_value(ctx, message) -> None:
    with pytest.raises(validation.ConfigError) as err:
        _settings(**ctx)
    assert message in str(err.value)


def test_the_construct_refuses_a_pool_on_a_capacity_block() -> None:
    from constructs_lib import warm_pool

    with pytest.raises(validation.ConfigError, match=r"C/Workers: warm_pool_size=2 cannot be "
                       r"used with capacity_block_id=cr-1"):
        warm_pool.check("C/Workers", 2, spot_capacity=0, instance_types=("p5.48xlarge",),
                        capacity_block_id="cr-1")


def test_one_fallback_free_type_list_is_accepted() -> None:
    assert _settings(warmPoolSize="1", workerInstanceTypes="p5.48xlarge").warm_pool_size == 1


def test_the_construct_refuses_spot_and_mixed_types_naming_itself() -> None:
    import aws_cdk as cdk

    from constructs_lib import DeepLearningCluster

    for props, words in (({"spot_workers": 1}, "spot_capacity=1"),
                         ({"worker_instance_types": ["p5.48xlarge", "p4d.24xlarge"]},
                          "p5.48xlarge,p4d.24xlarge")):
        stack = cdk.Stack(cdk.App(), "S", env=cdk.Environment(region="us-east-1",
                                                               account="123456789012"))
        with pytest.raises(validation.ConfigError) as err:
            DeepLearningCluster(stack, "Cluster", warm_pool_size=2, **props)
        assert "Cluster" in str(err.value) and "warm_pool_size=2" in str(err.value)
        assert words in str(err.value)


@pytest.mark.skipif(checkov_binary() is None,
                    reason="checkov is not installed: make checkov-setup (its own venv)")
def test_checkov_finds_nothing_new_with_a_warm_pool(warm, tmp_path) -> None:
    """The warm pool, its hook and grant add no checkov finding without a listed skip."""
    failures = failed_checks(warm.to_json(), tmp_path)
    left = [f"{check} {resource}" for check, resource in failures
            if not any(s.covers(check, resource) for s in SKIPS)]
    assert not left, "checkov findings without a skip:\n" + "\n".join(left)

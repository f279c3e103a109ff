"""IAM drills: the deployed cluster with moto's IAM authorization enforced
(``make demo ARGS="--enforce-iam --data --keep"``, ``emulator/iam_enforcement.py``).

From the end of the deploy every call is checked against the caller's policies: the nodes'
agents, executors, controller and CloudWatch agents with their instance roles' temporary
credentials (from the emulated instance metadata), the jobs with the job role's session
credentials (tagged with their user), the demo's own calls as the account's administrator.

- (a) the normal path: the example trains from its S3 data to the end, its checkpoints are
  mirrored to S3, and no process was refused anything (no ``AccessDenied`` in any node,
  job or emulator log);
- (b) a worker's role is refused ReceiveMessage on the master queue, which the master's
  role may do;
- (c) a job whose ``--data`` is a prefix the job role may not read fails before it starts,
  naming the object and ``AccessDenied``;
- (d) an operator (an IAM user with the stack's operator policy and a ``dl-user`` tag) may
  do what the policy gives and is refused the rest.

What moto does not evaluate (conditions, resource policies, a SendCommand's instances):
docs/emulator.md. One demo run (chaos-marked: ``make chaos``, not CI).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from bootstrap_scripts.node.procgroup import alive, pids_in_groups
from emulator.demo.context import BIN_DIR, STATE_FILE
from emulator.demo.data import BUCKET
from emulator.nodes import base_env
from tests.chaos.drills import drill
from tests.conftest import REPO_ROOT
from tests.support.demo import run_demo
from tests.support.kept import demo_stop, state_groups

pytestmark = pytest.mark.chaos
ACCOUNT = "123456789012"
DENIED = re.compile(r"AccessDenied|not authorized to perform|Access Denied")


@pytest.fixture(scope="module")
def enforced(tmp_path_factory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("iam")
    code, out, report = run_demo(tmp, "--enforce-iam", "--data", "--keep", "--workers", "1")
    work = tmp / "work"
    state_path = work / STATE_FILE
    groups = state_groups(state_path)
    try:
        state = json.loads(state_path.read_text())
        yield {"code": code, "out": out, "report": report, "work": work, "state": state}
    finally:
        groups |= state_groups(state_path)
        stop = demo_stop(state_path, "--keep-files")
        left = pids_in_groups(groups) | {g for g in groups if alive(g)}
        for pgid in left:
            os.killpg(pgid, signal.SIGKILL)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert not left, f"processes left behind after --stop: {sorted(left)}"


def client(state: dict, service: str, creds: dict | None = None):
    c = creds or {"AccessKeyId": "testing", "SecretAccessKey": "testing",
                  "SessionToken": "testing"}
    return boto3.client(service, endpoint_url=state["endpoint"], region_name="us-east-1",
                        aws_access_key_id=c["AccessKeyId"],
                        aws_secret_access_key=c["SecretAccessKey"],
                        aws_session_token=c.get("SessionToken") or c.get("Token") or "")


def stack_resources(state: dict) -> dict[str, str]:
    cfn = client(state, "cloudformation")
    return {r["LogicalResourceId"]: r.get("PhysicalResourceId", "")
            for r in cfn.describe_stack_resources(StackName="DLClusterStack")["StackResources"]
            if "LogicalResourceId" in r}


def one(resources: dict[str, str], prefix: str, *, without: str = "\0") -> str:
    (found,) = [v for k, v in resources.items() if k.startswith(prefix) and without not in k]
    return found


def node_credentials(node: dict) -> dict:
    """What the node's processes get: its instance role's credentials, from its metadata
    endpoint (IMDSv2), as botocore's default chain fetches them."""
    base = node["imds_url"].rstrip("/")
    token = urllib.request.urlopen(urllib.request.Request(
        f"{base}/latest/api/token", method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}), timeout=10).read().decode()

    def get(path: str) -> str:
        return urllib.request.urlopen(urllib.request.Request(
            f"{base}/latest/meta-data/iam/security-credentials/{path}",
            headers={"X-aws-ec2-metadata-token": token}), timeout=10).read().decode()

    role = get("").split()[0]
    return json.loads(get(role))


def nodes(state: dict, role: str) -> list[dict]:
    return [n for n in state["nodes"] if n["role"] == role and n.get("status") != "stopped"]


def error_code(call) -> str:
    try:
        call()
    except ClientError as exc:
        return exc.response["Error"].get("Code", "") or str(exc)
    return "allowed"


def denied(code: str) -> bool:
    return code in ("AccessDenied", "403", "AccessDeniedException")


def denials_in_logs(work: Path) -> list[str]:
    found = []
    logs = [*work.joinpath("logs").glob("*.log"), *work.joinpath("efs", "jobs").rglob("*.log")]
    for path in logs:
        if path.name == "cloud.log":
            continue
        for line in path.read_text(errors="replace").splitlines():
            if DENIED.search(line):
                found.append(f"{path.name}: {line[:200]}")
    cloud = work / "logs" / "cloud.log"
    found += [f"cloud.log: {x[:300]}" for x in cloud.read_text(errors="replace").splitlines()
              if x.startswith("iam: denied")] if cloud.exists() else []
    return found


def test_a_normal_path_every_call_allowed_by_the_stacks_policies(enforced: dict) -> None:
    work, state = enforced["work"], enforced["state"]
    with drill("IAM (a)", "IAM enforced from the deploy on: train from S3 data, mirror "
               "checkpoints") as row:
        row.check("demo passed", enforced["code"] == 0, enforced["out"][-600:])
        found = denials_in_logs(work)
        row.check("no AccessDenied in any log", not found, "; ".join(found[:5]))
        cloud = (work / "logs" / "cloud.log").read_text(errors="replace")
        tagged = re.findall(r"iam: session \S+ tagged \{'dl-user': '([^']+)'\}", cloud)
        row.check("job sessions carry their user's tag", bool(tagged),
                  f"{len(tagged)} sessions, users {sorted(set(tagged))}")
        bucket = one(stack_resources(state), "ClusterTrainingDataCheckpointBucket")
        keys = client(state, "s3").list_objects_v2(Bucket=bucket).get("Contents", [])
        row.check("checkpoints mirrored to S3 under the job role", bool(keys),
                  f"{len(keys)} objects")


def test_b_a_workers_role_may_not_receive_from_the_master_queue(enforced: dict) -> None:
    state = enforced["state"]
    queue = one(stack_resources(state), "ClusterMetadataQueuesMaster", without="DeadLetters")
    with drill("IAM (b)", "a worker's instance role calls ReceiveMessage on the master "
               "queue") as row:
        worker = client(state, "sqs", node_credentials(nodes(state, "worker")[0]))
        code = error_code(lambda: worker.receive_message(QueueUrl=queue, VisibilityTimeout=0))
        row.check("worker refused", denied(code), code)
        master = client(state, "sqs", node_credentials(nodes(state, "master")[0]))
        code = error_code(lambda: master.receive_message(QueueUrl=queue, VisibilityTimeout=0))
        row.check("master allowed", code == "allowed", code)


def test_c_a_denied_data_prefix_fails_before_the_job_starts(enforced: dict) -> None:
    state = enforced["state"]
    master = nodes(state, "master")[0]
    client(state, "s3").put_object(Bucket=BUCKET, Key="private/weights.npz", Body=b"x")
    root = Path(master["root"])
    argv = [str(root / BIN_DIR / "dl-run"), "--root", str(root), "--data",
            f"s3://{BUCKET}/private/", "--", "python", "-c", "print('job-body-ran')"]
    # root's dl-run on the master, as the kept cluster's master shell runs it: the master's
    # instance metadata (its role signs root's job spec, L33) and the emulated AWS's
    # endpoint, nothing else of AWS
    env = {**base_env(state.get("aws")), "AWS_EC2_METADATA_DISABLED": "false",
           "AWS_EC2_METADATA_SERVICE_ENDPOINT": master["imds_url"],
           "AWS_ENDPOINT_URL": state["endpoint"]}
    with drill("IAM (c)", "dl-run --data from a prefix the job role may not read") as row:
        res = subprocess.run(argv, cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        out = res.stdout + res.stderr
        row.check("dl-run failed", res.returncode != 0, f"exit {res.returncode}")
        row.check("names the object", f"s3://{BUCKET}/private/weights.npz" in out, out[-400:])
        row.check("says access denied", bool(re.search(r"(?i)access ?denied", out)), out[-400:])
        row.check("the job never started", "job-body-ran" not in out)


def test_d_an_operator_gets_what_the_operator_policy_gives_and_nothing_else(
        enforced: dict) -> None:
    state = enforced["state"]
    res = stack_resources(state)
    iam = client(state, "iam")
    iam.create_user(UserName="alice", Tags=[{"Key": "dl-user", "Value": "alice"}])
    policy = one(res, "ClusterOperatorAccessPolicy")
    policy_arn = policy if policy.startswith("arn:") else \
        f"arn:aws:iam::{ACCOUNT}:policy/{policy}"
    iam.attach_user_policy(UserName="alice", PolicyArn=policy_arn)
    key = iam.create_access_key(UserName="alice")["AccessKey"]
    creds = {**key, "SessionToken": ""}
    staging = one(res, "ClusterWorkdirStagingBucket")
    worker_group = next(g for g in client(state, "autoscaling").describe_auto_scaling_groups()[
        "AutoScalingGroups"] if {"Key": "NodeType", "Value": "Worker"} in
        [{"Key": t["Key"], "Value": t["Value"]} for t in g["Tags"]])["AutoScalingGroupName"]
    queue = one(res, "ClusterMetadataQueuesMaster", without="DeadLetters")
    asg, s3, ssm, sqs, cfn = (client(state, s, creds)
                              for s in ("autoscaling", "s3", "ssm", "sqs", "cloudformation"))
    with drill("IAM (d)", "an operator's IAM user (operator policy, dl-user=alice)") as row:
        checks = {
            "describe the groups": (lambda: asg.describe_auto_scaling_groups(), True),
            "describe the stack": (lambda: cfn.describe_stacks(StackName="DLClusterStack"),
                                   True),
            "ship a workdir to its own prefix": (lambda: s3.put_object(
                Bucket=staging, Key="workdirs/alice/w.tar", Body=b"x"), True),
            "run its own user's document": (lambda: ssm.send_command(
                DocumentName="dl-op.DLClusterStack.alice",
                InstanceIds=["i-00000000000000000"]), True),
            "ship into another user's prefix": (lambda: s3.put_object(
                Bucket=staging, Key="workdirs/bob/w.tar", Body=b"x"), False),
            "run another user's document": (lambda: ssm.send_command(
                DocumentName="dl-op.DLClusterStack.bob",
                InstanceIds=["i-00000000000000000"]), False),
            "resize the worker group": (lambda: asg.set_desired_capacity(
                AutoScalingGroupName=worker_group, DesiredCapacity=0), False),
            "read the master queue": (lambda: sqs.receive_message(
                QueueUrl=queue, VisibilityTimeout=0), False),
        }
        for what, (call, allowed) in checks.items():
            code = error_code(call)
            # "allowed" past IAM: any answer but AccessDenied (a missing document is moto's)
            row.check(what, (not denied(code)) if allowed else denied(code), code)

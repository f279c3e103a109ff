"""Resume drill: train on a cluster, tear it down, resume the same job on a NEW cluster from
its S3 checkpoint, with the README's commands ("Data in S3") and moto's IAM authorization on.

1. Cluster A: ``make demo ARGS="--enforce-iam --data --keep --workers 1"`` (real nodes: the
   emulated EC2 boots one node process tree per instance); a real unprivileged user runs the
   example with ``dlc submit --as USER --data s3://…`` (its dataset in S3), its checkpoints
   mirrored to A's checkpoint bucket under the job role's session.
2. ``dlc down``: the real CDK destroy; A's instances terminate, its checkpoint bucket is kept.
3. ``dlc up -c resumeFrom=<A's CheckpointUrl>``: cluster B in the same emulated account; the
   kept emulator plays Auto Scaling for B's groups (``emulator/demo/restack.py``): B's nodes
   boot, B mounts its own new file system (A's job's EFS copy is not there), and ``dlc up``
   waits for B's membership as on AWS.
4. ``dlc submit --resume-from s3://<A bucket>/checkpoints/<A id>/<user>/<job>/ -- … --resume``
   on B resumes at the next epoch: B's job role reads A's prefix, authorized by moto
   (resource level, the ``dl-user`` session tag substituted into the grant).
5. The negative: the same user resuming another user's prefix of A's bucket fails before the
   attempt starts; the restore's log (which ``dlc logs -f`` names) names the prefix and
   ``AccessDenied``.

What this does not prove (moto evaluates no conditions and no KMS use through S3): the
grant's ``kms:ViaService`` / encryption-context conditions and a real KMS decrypt across
stacks (docs/emulator.md). Chaos-marked (``make chaos``), not CI; prints its wall time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.node.procgroup import alive, pids_in_groups
from emulator.address_space import vpc_cidr
from emulator.demo.context import STATE_FILE
from emulator.demo.data import BUCKET, PREFIX, SOURCE
from emulator.deploy import pick_ami
from emulator.nodes import PYTHON
from tests.chaos.drills import drill
from tests.conftest import REPO_ROOT
from tests.support.bounded import dlc_follow, run_bounded
from tests.support.demo import demo_env, run_demo
from tests.support.kept import demo_stop, state_groups
from tests.support.users import CAN_CREATE_USERS, cluster_user, reachable

pytestmark = pytest.mark.chaos
STACK = "DLClusterStack"
EXAMPLE = ("python", "-m", "bootstrap_scripts.examples.train_digits", "--require-acc", "0.3",
           "--global-batch-size", "64")
#: The other user whose prefix of A's bucket the negative tries to resume from.
OTHER = "mallory"


def dlc(flow: dict, *args: str, timeout: float = 900) -> tuple[int, str, str]:
    """``dlc --emulator STATE ARGS`` in its own process (dlc's cache in the test's dir)."""
    res = run_bounded([sys.executable, "-m", "dlc", "--emulator", str(flow["state_path"]),
                       *args], timeout, what=f"dlc {' '.join(args[:2])}", cwd=REPO_ROOT,
                      env={**demo_env(), "XDG_CACHE_HOME": str(flow["cache"])})
    return res.returncode, res.stdout, res.stderr


def client(endpoint: str, service: str):
    """A client as the account's administrator (the harness's keys, emulator/deploy.py)."""
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        aws_session_token="testing")


def outputs(endpoint: str) -> dict[str, str]:
    cfn = client(endpoint, "cloudformation")
    (stack,) = cfn.describe_stacks(StackName=STACK)["Stacks"]
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def submit(flow: dict, *args: str) -> tuple[str, int, str, str]:
    """(job id, ``dlc logs -f``'s exit status, stdout, stderr) of one job as the user."""
    code, out, err = dlc(flow, "submit", "--as", flow["user"], "--json", *args)
    assert code == 0, f"dlc submit: exit {code}: {err[-1500:]}"
    job = json.loads(out)["job_id"]
    code, out, err = dlc_follow(flow["state_path"], job)
    return job, code, out, err


@pytest.fixture(scope="module")
def flow() -> Iterator[dict]:
    """Steps 1-3 (module doc); yields what steps 4 and 5 need. Every process the demo and the
    kept service started (A's and B's nodes) is stopped at the end, and checked gone."""
    if not CAN_CREATE_USERS:
        pytest.skip("the job's user is a real unprivileged user: creating it needs root")
    t0 = time.monotonic()
    # not under pytest's temp root: a pytest starting meanwhile (another session) makes that
    # 0700 again, and the job's user must reach the EFS directory inside
    tmp = Path(tempfile.mkdtemp(prefix="dl-resume-"))
    code, out, _report = run_demo(tmp, "--enforce-iam", "--data", "--keep", "--workers", "1",
                                  "--epochs", "2", "--require-acc", "0.3")
    work = tmp / "work"
    state_path = work / STATE_FILE
    groups = state_groups(state_path)
    try:
        assert code == 0, out[-3000:]
        state = json.loads(state_path.read_text())
        endpoint = state["endpoint"]
        python_dir = os.path.realpath(os.path.dirname(PYTHON))
        with cluster_user() as user, reachable(os.path.realpath(PYTHON), PYTHON,
                                               python_dir + "/x", str(REPO_ROOT) + "/x",
                                               work / "x"):
            flow = {"state_path": state_path, "cache": tmp / "cache", "user": user.pw_name,
                    "work": work, "endpoint": endpoint, "timings": {}}
            a = outputs(endpoint)
            job, code, jout, jerr = submit(flow, "--data", SOURCE, "--", *EXAMPLE,
                                           "--epochs", "2")
            assert code == 0 and f"job {job} succeeded" in jerr, jout[-2000:] + jerr
            flow.update(a=a, job=job, trained_s=time.monotonic() - t0)
            code, dout, derr = dlc(flow, "down")
            assert code == 0, dout[-2000:] + derr[-2000:]
            flow.update(down_out=dout, down_s=time.monotonic() - t0)
            ec2 = client(endpoint, "ec2")
            code, uout, uerr = dlc(
                flow, "up", "--timeout", "600", "-c", f"vpcCidr={vpc_cidr()}",
                "-c", f"amiId={pick_ami(ec2)}", "-c", "workerCount=1",
                "-c", f"dataBucket={BUCKET}", "-c", f"dataPrefix={PREFIX}",
                "-c", f"resumeFrom={a['CheckpointUrl']}")
            flow.update(up_code=code, up_out=uout + uerr, up_s=time.monotonic() - t0)
            assert code == 0, (uout[-3000:] + uerr[-2000:] + "\nservice log:\n" +
                               (work / "logs" / "emulator-service.log").read_text()[-3000:])
            flow["b"] = outputs(endpoint)
            yield flow
            flow["total_s"] = time.monotonic() - t0
            print(f"\nresume drill: A trained {flow['trained_s']:.0f} s, down "
                  f"{flow['down_s'] - flow['trained_s']:.0f} s, B up "
                  f"{flow['up_s'] - flow['down_s']:.0f} s, wall {flow['total_s']:.0f} s "
                  "(real node processes, moto with IAM enforced)")
    finally:
        groups |= state_groups(state_path)  # B's nodes, booted by the kept service
        stop = demo_stop(state_path, "--keep-files")
        left = pids_in_groups(groups) | {g for g in groups if alive(g)}
        for pgid in left:
            os.killpg(pgid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert not left, f"processes left behind after --stop: {sorted(left)}"


def mirrored(endpoint: str, bucket: str, prefix: str) -> list[str]:
    s3 = client(endpoint, "s3")
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
                  .get("Contents", []))


def test_a_the_first_clusters_checkpoints_outlive_it(flow: dict) -> None:
    a, b = flow["a"], flow["b"]
    prefix = f"checkpoints/{STACK}/{flow['user']}/{flow['job']}/"
    with drill("resume (a)", "train on A, dlc down, dlc up B with resumeFrom") as row:
        keys = mirrored(flow["endpoint"], a["CheckpointBucketName"], prefix)
        row.check("A's epoch-2 checkpoint mirrored", any(
            k.endswith("epoch-0002.manifest.json") for k in keys), str(keys))
        row.check("dlc down kept A's bucket",
                  f"kept checkpoint bucket {a['CheckpointBucketName']}" in flow["down_out"],
                  flow["down_out"][-300:])
        row.check("B is a new stack with its own bucket and file system",
                  b["CheckpointBucketName"] != a["CheckpointBucketName"]
                  and b["FileSystemId"] != a["FileSystemId"], f"{a} / {b}")
        row.check("B's membership formed (dlc up)", "all healthy" in flow["up_out"],
                  flow["up_out"][-300:])
        efs_copy = flow["work"] / "efs" / "checkpoints" / flow["user"] / flow["job"]
        row.check("B does not see A's EFS copy", not efs_copy.exists(), str(efs_copy))


def test_b_another_users_prefix_is_denied_before_the_attempt(flow: dict) -> None:
    a = flow["a"]
    src = f"checkpoints/{STACK}/{flow['user']}/{flow['job']}/"
    s3 = client(flow["endpoint"], "s3")
    other = f"checkpoints/{STACK}/{OTHER}/{flow['job']}/"
    for key in mirrored(flow["endpoint"], a["CheckpointBucketName"], src):  # as the admin
        s3.copy_object(Bucket=a["CheckpointBucketName"], Key=other + key[len(src):],
                       CopySource={"Bucket": a["CheckpointBucketName"], "Key": key})
    url = f"s3://{a['CheckpointBucketName']}/{other}"
    with drill("resume (b)", f"on B, --resume-from another user's prefix ({OTHER})") as row:
        _job, code, out, err = submit(flow, "--resume-from", url, "--", *EXAMPLE, "--epochs",
                                     "3", "--resume")
        said = out + err
        row.check("the job failed", code != 0, f"exit {code}")
        row.check("no epoch ran", "epoch=" not in out, out[-600:])
        # dlc logs -f says the restore failed and where its logs are; the cause is there
        where = re.search(r"not started: restoring its checkpoint \w+ \(logs: (\S+)\)", said)
        row.check("the restore failed before the attempt", where is not None, said[-600:])
        restore = "".join(f.read_text(errors="replace") for f in
                          sorted(Path(where.group(1)).glob("*")) if f.is_file()) if where else ""
        row.check("its log names the prefix", other in restore, restore[-600:])
        row.check("its log says AccessDenied", "AccessDenied" in restore, restore[-600:])
        # and the job's own FAILED line quotes the restore's error line: the cause without
        # opening the restore's log
        row.check("dlc logs names the cause",
                  re.search(r"FAILED: .*error: restore failed: .*AccessDenied", said)
                  is not None, said[-900:])


def test_c_the_job_resumes_on_the_new_cluster_from_the_old_clusters_bucket(
        flow: dict) -> None:
    a, b = flow["a"], flow["b"]
    url = f"s3://{a['CheckpointBucketName']}/checkpoints/{STACK}/{flow['user']}/{flow['job']}/"
    with drill("resume (c)", "on B, dlc submit --resume-from A's mirror of the job") as row:
        job, code, out, err = submit(flow, "--data", SOURCE, "--resume-from", url, "--",
                                     *EXAMPLE, "--epochs", "3", "--resume")
        row.check("succeeded", code == 0 and f"job {job} succeeded" in err,
                  out[-800:] + err[-400:])
        row.check("resumed from A's epoch 2", "resumed_from=epoch-0002.pt" in out, out[-800:])
        row.check("epoch 3 ran, epoch 1 did not", "epoch=3" in out and "epoch=1 " not in out,
                  out[-800:])
        keys = mirrored(flow["endpoint"], b["CheckpointBucketName"],
                        f"checkpoints/{STACK}/{flow['user']}/{job}/")
        row.check("B mirrors the resumed job to its own bucket",
                  any(k.endswith("epoch-0003.manifest.json") for k in keys), str(keys))

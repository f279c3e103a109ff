"""Jobs call AWS as the job role, never as the node (a real unprivileged user, real root
executors, moto's STS over HTTP).

The executors hold the node's credentials (on EC2: the instance role, from instance
metadata; here: the emulator's, in their environment). A user's job must not see them: it
gets temporary credentials of the stack's job role, tagged with its user, readable by that
user only, and found by the SDK on its own (AWS_CONFIG_FILE, credential_process).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.agent.install import BIN_DIR
from emulator.resources import agent_settings, install_args
from tests.conftest import REGION
from tests.support.cluster import CLUSTER_ID, LocalCluster
from tests.support.users import (  # noqa: F401
    add_user,
    cluster_for_users,
    job_user,
    reachable_python,
    remove_user,
    run_as,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="creating a user needs root")]
JOB = Path(__file__).parent / "jobs" / "whoami_aws.py"
AWSID = re.compile(r"^\[\d \S+\] awsid (\{.*\})$", re.M)
TRUST = json.dumps({"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
    "Action": ["sts:AssumeRole", "sts:TagSession"]}]})


@pytest.fixture()
def role_cluster(job_user, reachable_python, moto_reset) -> Iterator[tuple[LocalCluster, str]]:  # noqa: F811
    """Two nodes whose executors have the node's AWS credentials and the job role's ARN."""
    iam = boto3.client("iam", endpoint_url=moto_reset, region_name=REGION)
    arn = iam.create_role(RoleName=f"{CLUSTER_ID}-job", AssumeRolePolicyDocument=TRUST
                          )["Role"]["Arn"]
    with cluster_for_users("dl-jobrole-", 2) as c:
        for node in c.nodes:
            settings = agent_settings(node.role, cluster_id=CLUSTER_ID, mount_point=str(c.efs))
            node.install(install_args({**settings, "job-role-arn": arn}))
            node.env.update({"AWS_ENDPOINT_URL": moto_reset, "AWS_ACCESS_KEY_ID": "NODEKEY",
                             "AWS_SECRET_ACCESS_KEY": "node-secret",
                             "AWS_SESSION_TOKEN": "node-token"})
        c.start_executors()
        yield c, arn


def test_a_users_job_calls_aws_as_the_job_role_tagged_with_its_user(role_cluster, job_user):  # noqa: F811
    c, arn = role_cluster
    rc, out = run_as(c, job_user, "--launcher", "each", "--", "python", str(JOB))
    assert rc == 0, out + "".join(c.executor_log(a) for a in c.addresses)
    seen = [json.loads(m.group(1)) for m in AWSID.finditer(out)]
    assert len(seen) == 2, out
    role_name = arn.rsplit("/", 1)[1]
    for s in seen:
        assert s["uid"] == job_user.pw_uid
        assert s["leaked"] == [], s  # the node's keys are not in the job's environment
        assert f":assumed-role/{role_name}/dl-{job_user.pw_name}-" in s["arn"], s
    # the share ended: its credentials are gone from the node
    assert not any(Path(s["config"]).exists() for s in seen)


def test_another_user_cannot_read_a_jobs_credentials(role_cluster, job_user):  # noqa: F811
    """While a job of one user runs, a second user on the same node finds nothing to read."""
    c, _arn = role_cluster
    name = f"dlspy{os.getpid() % 100000}"
    spy = add_user(name, "--user-group", "--shell", "/bin/sh")
    try:
        holder = Path(tempfile.mkdtemp(prefix="dl-hold-"))
        os.chmod(holder, 0o777)
        script = holder / "hold.py"
        script.write_text(
            "import os, pathlib, time\n"
            "c = pathlib.Path(os.environ['AWS_CONFIG_FILE'])\n"
            f"pathlib.Path('{holder}/where').write_text(str(c.parent))\n"
            f"while not pathlib.Path('{holder}/done').exists():\n"
            "    time.sleep(0.1)\n")
        os.chmod(script, 0o644)
        p = subprocess.Popen([str(c.master_root / BIN_DIR / "dl-run"), "--root",
                              str(c.master_root), "--unmanaged", "--launcher", "each", "--",
                              "python", str(script)],
                             env={"PATH": os.environ["PATH"], "HOME": job_user.pw_dir},
                             user=job_user.pw_uid, group=job_user.pw_gid, extra_groups=[],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        c.runners.append(p)
        try:
            for _ in range(600):
                if (holder / "where").exists():
                    break
                p.poll()
                assert p.returncode is None, p.stdout.read()
                time.sleep(0.1)
            where = Path((holder / "where").read_text())
            st = os.lstat(where)
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o711)  # root's, no listing
            for f in ("credentials.json", "config"):
                st = os.lstat(where / f)
                assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (job_user.pw_uid, 0o600), f
            probe = subprocess.run(
                ["python3", "-c", "import os,sys\nd=sys.argv[1]\n"
                 "for f in ('credentials.json','config'):\n"
                 "    try:\n        open(os.path.join(d,f)).read(); print('READ', f)\n"
                 "    except OSError as e: print('DENIED', f, e.errno)\n"
                 "try:\n    print('LIST', os.listdir(d))\nexcept OSError as e:\n"
                 "    print('NOLIST', e.errno)\n", str(where)],
                user=spy.pw_uid, group=spy.pw_gid, extra_groups=[], capture_output=True,
                text=True, timeout=30)
            assert "READ" not in probe.stdout and "LIST" not in probe.stdout.replace(
                "NOLIST", ""), probe.stdout + probe.stderr
            assert probe.stdout.count("DENIED") == 2, probe.stdout + probe.stderr
        finally:
            (holder / "done").write_text("")
            p.communicate(timeout=120)
            shutil.rmtree(holder, ignore_errors=True)
    finally:
        remove_user(name, "--remove")

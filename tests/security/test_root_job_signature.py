"""Drill: root on a worker plants a job of root's on EFS, to be root on every node.

Every node mounts EFS as root, so root on any worker (or a job that reached it) can write
``jobs/root/<id>/spec.json`` or ``managed/root/<id>/request.json``. The executors run a spec
as its owner, the controller starts a request's attempts as its owner: before, that one
file ran its command as root on every node, the master included, whose root holds the
master's role. Now root's job files run only with the master's signature
(``bootstrap_scripts.jobs.engine.root_jobs``; the key is the membership key: ``kms:Sign``
the master's role alone, ``kms:GetPublicKey`` every node's, which checks locally; on moto's
real KMS server here).

The planted files are a real job's, copied by the attacker with its command changed: the
attacker has a template, not the key. That only the master's role may sign is the stack's
policy, checked at synth (tests/stack/test_membership_key.py); moto does not enforce it.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from bootstrap_scripts.agent.install import BIN_DIR
from bootstrap_scripts.jobs.engine import root_jobs
from emulator.nodes import base_env
from emulator.resources import agent_settings, install_args
from tests.conftest import REGION
from tests.security.conftest import wait_until
from tests.support.cluster import CLUSTER_ID
from tests.support.users import cluster_for_users

pytestmark = [pytest.mark.slow]

NODE_AWS = {"AWS_ACCESS_KEY_ID": "NODEKEY", "AWS_SECRET_ACCESS_KEY": "node-secret",
            "AWS_SESSION_TOKEN": "node-token"}


@pytest.fixture()
def signed_cluster(moto_reset: str, shared_tmp: Path) -> Iterator[SimpleNamespace]:
    """Two nodes installed with the membership key (as the stack's user data does), their
    executors and the master's controller running as root with the node's credentials."""
    if os.geteuid() != 0:
        pytest.skip("running the services as root needs root")
    kms = boto3.client("kms", endpoint_url=moto_reset, region_name=REGION)
    key = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    aws = {"AWS_ENDPOINT_URL": moto_reset, **NODE_AWS}
    with cluster_for_users("dl-rootjob-", 2) as c:
        for node in c.nodes:
            settings = agent_settings(node.role, cluster_id=CLUSTER_ID, mount_point=str(c.efs))
            node.install(install_args({**settings, "membership-key": key}))
            node.env.update(aws)
        c.start_executors()
        c.start_controller(aws)
        yield SimpleNamespace(c=c, key=key, aws=aws, marks=shared_tmp)


def dl_run(c, aws: dict[str, str], *args: str, timeout: float = 120) -> tuple[int, str]:
    """Root's ``dl-run`` on the master (where the master's role signs)."""
    import subprocess

    p = subprocess.run([str(c.master_root / BIN_DIR / "dl-run"), "--root", str(c.master_root),
                        *args], env=base_env(aws), text=True, capture_output=True,
                       timeout=timeout, start_new_session=True)
    return p.returncode, p.stdout + p.stderr


def mark_command(marks: Path, name: str) -> list[str]:
    return ["sh", "-c", f"id -u > {marks}/{name}-$DL_NODE_RANK"]


def plant(src: Path, dst: Path, old: str, new: str, *, names: tuple[str, ...],
          keep_signature: bool) -> None:
    """What root on a worker can do: copy a real job of root's with its id and command
    changed (with or without the original's signature beside it)."""
    dst.mkdir(mode=0o755)
    for name in names:
        (dst / name).write_text((src / name).read_text().replace(old, new))
        os.chmod(dst / name, 0o600)
        if keep_signature:
            sig = name + root_jobs.SUFFIX
            (dst / sig).write_text((src / sig).read_text())


def executor_logs(c) -> str:
    return "".join(c.executor_log(a) for a in c.addresses)


def test_a_root_job_a_worker_plants_runs_nowhere(signed_cluster):
    s = signed_cluster
    c, marks = s.c, s.marks
    ok = f"rootok-{secrets.token_hex(3)}"
    rc, out = dl_run(c, s.aws, "--unmanaged", "--job-id", ok, "--launcher", "each", "--",
                     *mark_command(marks, ok))
    assert rc == 0, out + executor_logs(c)
    # the master's dl-run signed it, both executors checked it with KMS and ran it as root
    assert sorted(p.name for p in marks.glob(f"{ok}-*")) == [f"{ok}-0", f"{ok}-1"]
    assert all(p.read_text().strip() == "0" for p in marks.glob(f"{ok}-*"))
    src = c.efs / "jobs" / "root" / ok
    assert (src / "spec.json.sig").is_file()

    # root on a worker copies it under new ids with its own command: unsigned, and with
    # the original's signature (which does not cover the changed bytes)
    forged = [f"forged-{secrets.token_hex(3)}", f"forged-{secrets.token_hex(3)}"]
    for job_id, keep in zip(forged, (False, True), strict=True):
        plant(src, c.efs / "jobs" / "root" / job_id, ok, job_id, names=("spec.json",),
              keep_signature=keep)
    wait_until("both executors refusing both planted specs", lambda: all(
        executor_logs(c).count(f"job root/{job_id}: refused: root's spec.json") == 2
        for job_id in forged), timeout=30)
    logs = executor_logs(c)
    assert f"job root/{forged[0]}: refused: root's spec.json carries no master's signature" \
        in logs
    assert f"job root/{forged[1]}: refused: root's spec.json: the signature is not the " \
        "master's" in logs
    time.sleep(1.0)
    assert not list(marks.glob("forged-*")), "a planted root job ran"


def test_a_root_request_a_worker_plants_is_failed_not_run(signed_cluster):
    s = signed_cluster
    c, marks = s.c, s.marks
    ok = f"mok-{secrets.token_hex(3)}"
    rc, out = dl_run(c, s.aws, "--job-id", ok, "--launcher", "each", "--",
                     *mark_command(marks, ok), timeout=180)
    assert rc == 0, out + c.controller_log()
    assert sorted(p.name for p in marks.glob(f"{ok}-*")) == [f"{ok}-0", f"{ok}-1"]
    src = c.efs / "managed" / "root" / ok
    assert (src / "request.json.sig").is_file()

    forged = f"mforged-{secrets.token_hex(3)}"
    plant(src, c.efs / "managed" / "root" / forged, ok, forged, names=("request.json",),
          keep_signature=False)
    job = c.efs / "managed" / "root" / forged / "job.json"
    wait_until("the controller's record of the planted request", job.exists, timeout=30)
    text = job.read_text()
    assert '"failed"' in text and "root's request.json carries no master's signature" in text
    time.sleep(1.0)
    assert not list(marks.glob("mforged-*")), "a planted root request ran"
    assert not list((c.efs / "jobs" / "root").glob(f"{forged}.*")), "an attempt was started"


def test_without_the_key_the_planted_root_job_would_run(signed_cluster):
    """The drill can fail: the same planted spec on nodes without the key (nothing is
    checked there) runs as root on every node."""
    s = signed_cluster
    c, marks = s.c, s.marks
    ok = f"rootok-{secrets.token_hex(3)}"
    rc, out = dl_run(c, s.aws, "--unmanaged", "--job-id", ok, "--launcher", "each", "--",
                     *mark_command(marks, ok))
    assert rc == 0, out
    for node in c.nodes:
        (node.root / root_jobs.KEY_FILE).unlink()
        c.executors[node.address].terminate()  # as systemd restarts the unit
        c.executors[node.address].wait(timeout=30)
    c.start_executors()
    time.sleep(2.0)  # past their first scan: a job found then waits for its runner's beat
    forged = f"forged-{secrets.token_hex(3)}"
    plant(c.efs / "jobs" / "root" / ok, c.efs / "jobs" / "root" / forged, ok, forged,
          names=("spec.json",), keep_signature=False)
    try:
        wait_until("the planted job running on both nodes",
                   lambda: len(list(marks.glob(f"{forged}-*"))) == 2, timeout=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{executor_logs(c)}") from None
    assert all(p.read_text().strip() == "0" for p in marks.glob(f"{forged}-*"))

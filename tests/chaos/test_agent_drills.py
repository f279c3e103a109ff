"""Fault drills on the master agent, all on one formed cluster (module fixture).

The AWS side is moto's real HTTP server (the emulator's, shared by the session): the master
queue, its dead-letter queue, the groups; the wait condition is the emulator's handle. The
master agent is the real agent code (``NodeAgent``) in a thread of this process against
that server (as tests/agent/ runs it: an emulated node would also need IMDS); the second
agent of drill (f) is a real process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from bootstrap_scripts.agent.lost_notifications import REFUSED_ATTRIBUTE
from bootstrap_scripts.agent.settings import EXIT_ALREADY_RUNNING
from bootstrap_scripts.protocol import state as shared
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import Registration
from emulator.resources import create_cluster
from emulator.wait_handle import WaitHandle
from tests.chaos.drills import drill, wait_for
from tests.conftest import REGION, REPO_ROOT
from tests.support.agents import AgentThread, config, master_identity

pytestmark = pytest.mark.chaos


@pytest.fixture(scope="module")
def formed(emulator_cloud, tmp_path_factory):
    """A cluster of a master and two workers, formed by a master agent (one SUCCESS)."""
    emulator_cloud.reset()
    tmp = tmp_path_factory.mktemp("agents")
    mp = pytest.MonkeyPatch()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        mp.setenv(name, "testing")  # as tests/conftest.py does per test: moto only
    mp.setenv("AWS_DEFAULT_REGION", REGION)
    mp.setenv("AWS_REGION", REGION)
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
    mp.setenv("AWS_ENDPOINT_URL", emulator_cloud.endpoint)
    mp.setenv("PATH", f"{tmp}/nobin:/usr/bin:/bin")  # no nvidia-smi: 0 GPUs
    handle = WaitHandle()
    env = SimpleNamespace(tmp=tmp, handle=handle, threads=[], master=None)
    try:
        cluster = create_cluster(emulator_cloud.endpoint, workers=2)
        env.cluster = cluster
        for wid, wip in cluster.instances("worker"):
            shared.write_registration(tmp / "efs", Registration(
                instance_id=wid, address=wip, gpus=0, role="worker",
                cluster_id=cluster.cluster_id))
        cluster.send(cluster.setup_message("master"))
        cluster.send(cluster.setup_message("worker"))
        env.master = start_master(env, registration_wait=5)
        (sig,) = handle.wait_for(1, timeout=60)
        assert sig["Status"] == "SUCCESS", sig
        yield env
    finally:
        for t in env.threads:
            t.stop()
        handle.stop()
        mp.undo()


def start_master(env, **kw) -> AgentThread:
    t = AgentThread(config(env.cluster, "master", env.tmp, "m", env.handle.url, **kw),
                    master_identity(env.cluster))
    env.threads.append(t)
    return t


def dead_letters(cluster) -> list[dict]:
    sqs = cluster.client("sqs")
    url = sqs.get_queue_url(QueueName=f"{cluster.cluster_id}-master-dlq")["QueueUrl"]
    return sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0,
                               MessageAttributeNames=["All"]).get("Messages", [])


def agent_log(env) -> str:
    path = ClusterPaths(env.tmp / "efs").agent_log(master_identity(env.cluster).instance_id)
    return path.read_text() if path.exists() else ""


def tmp_files(env) -> list[str]:
    return [str(p) for p in (env.tmp / "efs").rglob("*.tmp")] + [
        str(p) for p in (env.tmp / "nodes").rglob("*.tmp")]


def test_a_hostile_number_on_the_master_queue(formed):
    env = formed
    with drill("(a) desired: 1e400", "an SQS message with \"desired\": 1e400 on the master "
               "queue of a formed cluster") as row:
        hostile = json.dumps({**env.cluster.setup_message("worker"), "desired": "X"}) \
            .replace('"X"', "1e400")
        before = agent_log(env)
        t0 = time.monotonic()
        env.cluster.send(hostile)
        (dead,) = wait_for("the dead-lettered message", lambda: dead_letters(env.cluster), 30)
        row.seconds = time.monotonic() - t0
        refusal = dead["MessageAttributes"][REFUSED_ATTRIBUTE]["StringValue"]
        wait_for("the master queue to be empty", lambda: env.cluster.queue_depth() == 0, 10)
        log = agent_log(env)[len(before):]
        row.did = f"dead-lettered unchanged, refusal: {refusal[:80]}"
        row.check("record", dead["Body"] == hostile and "'desired'" in refusal
                  and log.count("event=refused-message ") == 1 and "event=dead-lettered" in log,
                  log[-300:])
        row.check("agent up", env.master.thread.is_alive() and env.master.exit_code is None)
        row.check("once", len(env.handle.signals) == 1, f"{len(env.handle.signals)} signals")
        row.check("nothing left", not tmp_files(env), "; ".join(tmp_files(env)[:3]))


def test_f_a_second_master_agent(formed):
    env = formed
    with drill("(f) second master agent", "a second dl-agent process started on the master "
               "beside the first") as row:
        cluster = env.cluster
        argv = [sys.executable, "-m", "bootstrap_scripts.agent.node_agent", "--role", "master",
                "--cluster-id", cluster.cluster_id, "--stack-name", "s", "--region", REGION,
                "--master-queue-url", cluster.master_queue_url, "--root",
                str(env.tmp / "nodes" / "m"), "--no-mount", "--mount-point",
                str(env.tmp / "efs")]
        members = shared.read_current(env.tmp / "efs")
        t0 = time.monotonic()
        try:
            res = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True,
                                 timeout=60)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError("the second agent kept running beside the first") from exc
        row.seconds = time.monotonic() - t0
        holder = re.search(r"pid (\d+)", res.stderr)
        row.did = (f"exit {res.returncode} (event=already-running, naming the holder pid "
                   f"{holder and holder.group(1)}); systemd does not restart that status")
        row.check("refused", res.returncode == EXIT_ALREADY_RUNNING
                  and "event=already-running" in res.stderr, res.stderr[-300:])
        row.check("first unaffected", env.master.thread.is_alive()
                  and shared.read_current(env.tmp / "efs") == members)
        row.check("once", len(env.handle.signals) == 1, f"{len(env.handle.signals)} signals")
        row.check("nothing left", not tmp_files(env))


def test_e_truncated_membership_and_a_master_restart(formed):
    env = formed
    with drill("(e) truncated membership.json", "membership.json cut in half, then the "
               "master agent restarted") as row:
        paths = ClusterPaths(env.tmp / "efs")
        before = shared.read_current(env.tmp / "efs")
        log_before = paths.membership_log.read_text()
        env.master.stop()
        env.threads.remove(env.master)
        text = paths.membership.read_text()
        paths.membership.write_text(text[: len(text) // 2])
        t0 = time.monotonic()
        env.master = start_master(env)
        wait_for("the master to resume", lambda: env.master.agent.formed.is_set(), 60)
        row.seconds = time.monotonic() - t0
        after = shared.read_current(env.tmp / "efs")
        added = paths.membership_log.read_text()[len(log_before):]
        row.did = (f"membership back at generation {after.generation} with "
                   f"{len(after.nodes)} nodes; {len(env.handle.signals)} wait-condition signal")
        row.check("record", after.generation == before.generation
                  and after.nodes == before.nodes
                  and not paths.generation(before.generation + 1).exists()
                  and "event=membership-repaired" in agent_log(env),
                  f"generation {after.generation}")
        row.check("no duplicate ADDED", not added, added[:200])
        row.check("once", len(env.handle.signals) == 1, f"{len(env.handle.signals)} signals")
        row.check("agent up", env.master.thread.is_alive())
        row.check("nothing left", not tmp_files(env))

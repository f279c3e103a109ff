"""Drills: a user (or root on a worker) leaves a record no reader expects, and every root
daemon goes on serving the other users.

Played by a REAL unprivileged attacker against the real root job executor and job controller
of an emulated master (the ``cluster`` fixture): a job spec that is a JSON array, one
nested 100,000 deep, one whose environment names a variable with ``=``; a managed job
record nested 100,000 deep (the controller and ``dl-jobs``); a FIFO left as a job's
checkpoint ``latest.json`` where the controller reads it before a restart. After each the
daemon is still running and the victim's job, submitted after the attack, runs to its end.
The readers of the membership (``dl-health``, a worker's agent) and of a node's executor
record (the master's controller) are driven directly with a FIFO and a 100,000-deep
document in the file's place. The shapes themselves are fuzzed in
``tests/protocol/test_reader_fuzz.py``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bootstrap_scripts.agent import worker
from bootstrap_scripts.jobs.controller.node_heartbeats import SignedHeartbeats
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from emulator.nodes import PYTHON, base_env
from tests.conftest import REPO_ROOT
from tests.security.conftest import as_user, dl, wait_until
from tests.support import hostile_files as hostile

pytestmark = [pytest.mark.slow]

#: the attacker's side: job directories of their own whose spec.json is what argv says
#: (``deep:N`` is N nested arrays, made here: a 200 KB argument is beyond argv's limit)
PLANT_SPECS = """
import os, sys
jobs = sys.argv[1]
for pair in sys.argv[2:]:
    job_id, _, text = pair.partition("=")
    if text.startswith("deep:"):
        n = int(text[5:])
        text = "[" * n + "]" * n
    d = os.path.join(jobs, job_id)
    os.mkdir(d, 0o755)
    fd = os.open(os.path.join(d, "spec.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, text.encode())
    os.close(fd)
"""

#: the attacker's side: managed job directories holding a job.json / request.json nested
#: argv[2] deep
PLANT_MANAGED = """
import os, sys
managed, n = sys.argv[1], int(sys.argv[2])
for job_id, name in (("evil-deep-record", "job.json"), ("evil-deep-request", "request.json")):
    d = os.path.join(managed, job_id)
    os.mkdir(d, 0o700)
    with open(os.path.join(d, name), "w") as fh:
        fh.write('{"a":' * n + "1" + "}" * n)
"""

#: the victim's job: one line of output, exit 0
VICTIM = ("--launcher", "each", "--", PYTHON, "-c", "print('the victim ran')")


def env_spec(address: str) -> str:
    """A spec that is well formed but for a variable name holding '='."""
    spec = JobSpec(job_id="evil-env", launcher="each",
                   shares=(Share(0, address, (Proc(argv=("/bin/true",)),)),),
                   env={"A=B": "1"}, created_at=time.time(), orphan_timeout=300)
    return spec.to_json()


def test_malformed_specs_never_stop_the_executor(cluster, victim, attacker):
    c = cluster
    address = c.membership.master_addr
    jobs = ClusterPaths(c.efs).jobs_dir / attacker.pw_name
    planted = as_user(attacker, PLANT_SPECS, str(jobs), "evil-list=[]",
                      f"evil-deep=deep:{hostile.DEEP}", f"evil-env={env_spec(address)}")
    assert planted.returncode == 0, planted.stderr
    wait_until("the executor to look at every planted spec", lambda: all(
        f"{attacker.pw_name}/{j}" in c.executor_log(address)
        for j in ("evil-list", "evil-deep", "evil-env")), timeout=60)

    rc, out = dl(c, victim, "dl-run", "--unmanaged", *VICTIM)
    assert rc == 0 and "the victim ran" in out, out + c.executor_log(address)
    assert c.executors[address].poll() is None, c.executor_log(address)
    assert not (jobs / "evil-env" / "nodes" / "0.started").exists()
    assert "Traceback" not in c.executor_log(address)


def test_a_deep_job_record_never_stops_the_controller_nor_dl_jobs(cluster, victim, attacker):
    c = cluster
    managed = ClusterPaths(c.efs).managed_dir / attacker.pw_name
    planted = as_user(attacker, PLANT_MANAGED, str(managed), str(hostile.DEEP))
    assert planted.returncode == 0, planted.stderr

    rc, out = dl(c, victim, "dl-run", *VICTIM)  # managed: the controller runs it
    assert rc == 0 and "the victim ran" in out, out + c.controller_log()
    assert c.controller.poll() is None, c.controller_log()
    for user in (victim, attacker):
        rc, out = dl(c, user, "dl-jobs", "--json", timeout=60)
        assert rc == 0, out
        listed = {j["job_id"] for j in json.loads(out)["jobs"]}
        assert "evil-deep-request" in listed, listed  # shown as unusable, not a crash


def test_dl_jobs_as_a_user_passes_over_another_users_private_checkpoints(
        cluster, victim, attacker):
    c = cluster
    rc, out = dl(c, victim, "dl-run", *VICTIM)
    assert rc == 0, out
    mine = ClusterPaths(c.efs).user_checkpoints(victim.pw_name)
    assert mine.is_dir() and mine.stat().st_mode & 0o077 == 0  # the victim's alone
    for args in ((), ("--json",)):
        rc, out = dl(c, attacker, "dl-jobs", *args, timeout=60)
        assert rc == 0 and "PermissionError" not in out, out


#: the attacker's job: a FIFO as its checkpoint directory's latest.json, then a failure the
#: controller restarts (reading the checkpoint position first)
FIFO_JOB = ("import os; d = os.environ['DL_CHECKPOINT_DIR']; os.makedirs(d, exist_ok=True); "
            "p = os.path.join(d, 'latest.json'); os.path.exists(p) or os.mkfifo(p); "
            "raise SystemExit(3)")


def test_a_fifo_as_a_checkpoints_latest_json_never_blocks_the_controller(
        cluster, victim, attacker):
    c = cluster
    rc, out = dl(c, attacker, "dl-run", "--detach", "--job-id", "evil-fifo",
                 "--max-code-restarts", "1", "--launcher", "each", "--", PYTHON, "-c",
                 FIFO_JOB)
    assert rc == 0, out
    job = ClusterPaths(c.efs).managed(f"{attacker.pw_name}/evil-fifo")

    def restarted() -> bool:
        with_record = job.record.exists() and json.loads(job.record.read_text())
        return bool(with_record) and with_record.get("attempt", 0) >= 2

    wait_until("the controller to restart the attacker's job", restarted, timeout=120)
    rc, out = dl(c, victim, "dl-run", *VICTIM)
    assert rc == 0 and "the victim ran" in out, out + c.controller_log()
    assert c.controller.poll() is None, c.controller_log()


# -- the membership's readers, and the master's reader of a node's executor record ----------
def node_with_membership(tmp_path: Path) -> SimpleNamespace:
    """A master's root whose local membership points at ``efs`` (the EFS one planted)."""
    efs, root = tmp_path / "efs", tmp_path / "master"
    m = build_membership(cluster_id="c", generation=1, efs_mount=str(efs),
                         master={"instance_id": "i-0aaaaaaaaaaaaaaa0", "address": "10.0.0.4",
                                 "gpus": 0}, workers=[])
    NodePaths(root).membership.parent.mkdir(parents=True)
    NodePaths(root).membership.write_text(m.to_json())
    ClusterPaths(efs).membership.parent.mkdir(parents=True)
    return SimpleNamespace(efs=efs, root=root, m=m, cluster=ClusterPaths(efs))


@pytest.mark.parametrize("kind", ["fifo", "fifo-with-writer", "deep"])
def test_dl_health_survives_what_is_left_as_the_membership(tmp_path, kind):
    n = node_with_membership(tmp_path)
    undo = lambda: None  # noqa: E731
    if kind == "deep":
        hostile.write(n.cluster.membership, hostile.deep_json())
    else:
        undo = hostile.plant(n.cluster.membership, kind)
    try:
        out = subprocess.run([PYTHON, "-m", "bootstrap_scripts.ops.health", "--root",
                              str(n.root), "--json", "--heartbeat-timeout", "0.2"],
                             cwd=REPO_ROOT, env=base_env(), capture_output=True, text=True,
                             timeout=hostile.BLOCKED_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"dl-health blocked on a {kind} as the membership") from None
    finally:
        undo()
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode in (0, 1), out.stderr
    # a valid membership renamed back into place is read again at once
    hostile.clear(n.cluster.membership)
    n.cluster.membership.write_text(n.m.to_json())
    again = subprocess.run([PYTHON, "-m", "bootstrap_scripts.ops.health", "--root",
                            str(n.root), "--json", "--heartbeat-timeout", "0.2"],
                           cwd=REPO_ROOT, env=base_env(), capture_output=True, text=True,
                           timeout=hostile.BLOCKED_SECONDS)
    assert "Traceback" not in again.stderr, again.stderr


@pytest.mark.parametrize("kind", ["fifo", "fifo-with-writer", "socket", "deep"])
def test_a_workers_agent_survives_what_is_left_as_the_membership(tmp_path, kind, caplog):
    n = node_with_membership(tmp_path)
    undo = lambda: None  # noqa: E731
    if kind == "deep":
        hostile.write(n.cluster.membership, hostile.deep_json())
    else:
        undo = hostile.plant(n.cluster.membership, kind)
    agent = SimpleNamespace(log=logging.getLogger("dl-agent-drill"))
    try:
        with caplog.at_level(logging.WARNING, logger="dl-agent-drill"):
            value, error = hostile.returns(lambda: worker.apply_from_efs(agent, n.cluster),
                                           n.cluster.membership)
    finally:
        undo()
    assert error is None, repr(error)
    assert value is True  # looked at again at the next tick
    assert "event=bad-membership" in caplog.text


@pytest.mark.parametrize("kind", ["fifo-with-writer", "device", "deep"])
def test_the_controllers_heartbeat_reader_survives_a_workers_record(tmp_path, kind):
    """Root on a worker writes its own executor record: the master's controller reads it
    (no key book here: the unchecked reading, the widest)."""
    n = node_with_membership(tmp_path)
    path = n.cluster.executor_heartbeat("10.0.0.4")
    undo = lambda: None  # noqa: E731
    if kind == "deep":
        hostile.write(path, '{"address": "10.0.0.4", "heartbeat": ' + hostile.deep_json()
                      + "}")
    else:
        undo = hostile.plant(path, kind)
    try:
        value, error = hostile.returns(lambda: SignedHeartbeats(n.root)(n.efs, "10.0.0.4"),
                                       path)
    finally:
        undo()
    assert error is None, repr(error)
    assert value is None

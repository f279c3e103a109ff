"""Slurm on an emulated cluster: the stack's AWS side in moto with ``scheduler=slurm`` (the
munge key in Secrets Manager, its ARN in the user data), every node booted as the emulator
boots an instance (its IMDS, the real installer writing the Slurm units, the real agent
reading the key and writing slurm.conf from the membership it applies), the units run as
``emulator.slurm_node`` runs them. The master's agent keeps Slurm's node list to the signed
membership: a worker's machine lost is DOWN with the reason and deleted; its replacement
registers with no person."""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import names, node, reconcile
from emulator import slurm_node
from emulator.deploy import aws_env
from emulator.node_inputs import PYTHON
from emulator.node_network import bind_preload
from emulator.nodes import Node, stop_nodes
from emulator.resources import ClusterResources, create_cluster
from tests.conftest import REPO_ROOT
from tests.support.agents import wait_until
from tests.support.slurm import slurm_work
from tests.support.users import cluster_user, login_env, reachable

SBATCH = Path(REPO_ROOT) / "bootstrap_scripts/examples/train_digits.sbatch"


class SlurmCluster:
    """The nodes of one emulated cluster booted under ``work`` (every parent traversable:
    ``slurm_work``)."""

    def __init__(self, work: Path, cluster: ClusterResources) -> None:
        self.work, self.cluster = work, cluster
        self.nodes: list[Node] = []

    def boot(self, role: str, instance) -> Node:
        n = Node(instance, role, self.work / "n" / instance.instance_id, self.work / "efs",
                 self.work / "logs")
        self.nodes.append(n)
        n.boot(self.cluster.install_args(role), aws_env(self.cluster.endpoint), "")
        return n

    @property
    def master(self) -> Node:
        return next(n for n in self.nodes if n.role == "master")

    def env(self) -> dict[str, str]:
        return node.slurm_env(SlurmPaths(self.master.root, self.work / "efs"))

    def slurm(self) -> dict[str, reconcile.SlurmNode]:
        return {x.name: x for x in reconcile.list_nodes("scontrol", self.env()) or []}

    def user_env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.env()["SLURM_CONF"],
                **slurm_node.user_env(bind_preload(self.work / "logs" / "lib"))}

    def wait_idle(self, nodes: list[Node]) -> None:
        want = [names.node_name(n.address) for n in nodes]
        wait_until(lambda: all("IDLE" in getattr(self.slurm().get(x), "states", ())
                               for x in want), 90, 0.25, f"{want} idle in Slurm")

    def job_ended(self, job: str) -> str:
        """The job's state once it ended ("" while it has not); a job Slurm held after a
        failed launch has ended for a test (it would wait for a person)."""
        res = subprocess.run(["scontrol", "show", "job", job, "-o"], env=self.env(),
                             capture_output=True, text=True, timeout=30, check=False)
        state = res.stdout.split("JobState=")[1].split()[0] if "JobState=" in res.stdout \
            else ""
        if state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", ""):
            return "HELD" if "launch failed" in res.stdout else ""
        return state

    def slurmd_logs(self) -> str:
        return "\n".join(f"== {p}\n{p.read_text()[-2000:]}" for n in self.nodes
                         for p in (n.root / "var/log/slurm").glob("slurmd*.log"))

    def applied(self, n: Node) -> int:
        try:
            return Membership.load(NodePaths(n.root).membership).generation
        except (OSError, ValueError):
            return 0


@pytest.fixture(scope="module")
def slurm_cluster(emulator_cloud) -> Iterator[SlurmCluster]:
    """Three nodes (the master and two workers, one GPU each), formed, every one idle in
    Slurm; shared by the tests below, which leave three nodes idle."""
    emulator_cloud.reset()
    with slurm_work() as work, pytest.MonkeyPatch.context() as mp:
        for k, v in aws_env(emulator_cloud.endpoint).items():  # no real account, ever
            mp.setenv(k, v)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        c = SlurmCluster(work, create_cluster(emulator_cloud.endpoint, workers=2,
                                              scheduler="slurm"))
        try:
            cluster = c.cluster
            cluster.send(cluster.setup_message("master"))
            cluster.send(cluster.setup_message("worker"))
            (master_i,) = cluster.node_instances("master")
            for i in cluster.node_instances("worker"):
                c.boot("worker", i)
            c.boot("master", master_i)
            wait_until(lambda: all(c.applied(n) == 1 for n in c.nodes), 120, 0.2,
                       "generation 1")
            c.wait_idle(c.nodes)
            yield c
        finally:
            assert not stop_nodes(c.nodes), "processes outlived the test"


@pytest.fixture(scope="module")
def user(slurm_cluster: SlurmCluster) -> Iterator[pwd.struct_passwd]:
    """A real user of the master, with a directory of their own to submit from (a stand-in
    for theirs on EFS), who can run this checkout's Python (as on a DLAMI)."""
    with cluster_user("dlslurm") as u, reachable(os.path.realpath(PYTHON), PYTHON, REPO_ROOT):
        home = slurm_cluster.work / "submit" / u.pw_name
        home.mkdir(parents=True)
        os.chown(home, u.pw_uid, u.pw_gid)
        yield u


def as_user(c: SlurmCluster, u: pwd.struct_passwd, *argv: str, timeout: float = 60
            ) -> subprocess.CompletedProcess:
    """``argv`` as ``u`` on the master, in their submit directory, with what a login shell
    on the emulated master has (emulator/demo/shell.py): slurm.conf and the bind preload."""
    return subprocess.run(list(argv), env={**login_env(u), **c.user_env()},
                          cwd=c.work / "submit" / u.pw_name, user=u.pw_uid, group=u.pw_gid,
                          extra_groups=[], text=True, capture_output=True, timeout=timeout,
                          check=False)


def test_a_users_srun_runs_on_every_node_under_its_name(
        slurm_cluster: SlurmCluster, user: pwd.struct_passwd) -> None:
    c = slurm_cluster
    key = SlurmPaths(c.master.root).munge_key
    assert oct(key.stat().st_mode & 0o777) == "0o400"
    # submitted from the master's login shell, which holds the master's DEEPLEARNING_* (srun
    # hands them to every task): each task still gets its own node's (the TaskProlog)
    res = as_user(c, user, "env", f"DEEPLEARNING_NODE_ADDR={c.master.address}",
                  "DEEPLEARNING_NODE_RANK=0", "srun", "-N3", "sh", "-c",
                  'echo "$(hostname) $(id -un) $DEEPLEARNING_NODE_ADDR"')
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == sorted(
        f"{names.node_name(n.address)} {user.pw_name} {n.address}" for n in c.nodes)


def test_the_ddp_sbatch_recipe_trains_the_example_unchanged(
        slurm_cluster: SlurmCluster, user: pwd.struct_passwd) -> None:
    """bootstrap_scripts/examples/train_digits.sbatch (``#SBATCH --nodes=3``, ``srun
    torchrun`` with the rendezvous host from ``scontrol show hostnames``) as a real user,
    to the example's accuracy."""
    c = slurm_cluster
    res = as_user(c, user, "sbatch", "--parsable", str(SBATCH), "--epochs", "5")
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    out = c.work / "submit" / user.pw_name / f"digits-ddp_{job}.out"
    deadline = time.monotonic() + 90
    while not (state := c.job_ended(job)) and time.monotonic() < deadline:
        time.sleep(0.5)
    text = out.read_text() if out.exists() else "(no output file)"
    assert state == "COMPLETED", f"{state or 'still running'}\n{text}\n{c.slurmd_logs()}"
    assert "start world_size=3" in text, text
    final = [line for line in text.splitlines() if "final acc=" in line]
    assert final, text
    acc = float(final[0].split("final acc=")[1].split()[0])
    assert acc >= 0.9, text


def test_a_lost_worker_is_down_with_the_reason_and_its_replacement_joins(
        slurm_cluster: SlurmCluster) -> None:
    c, cluster = slurm_cluster, slurm_cluster.cluster
    victim = next(n for n in c.nodes if n.role == "worker")
    before = {n.instance_id for n in c.nodes}
    victim.kill([])
    c.nodes.remove(victim)
    cluster.client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=victim.instance_id, ShouldDecrementDesiredCapacity=False)
    (new_i,) = [i for i in cluster.node_instances("worker") if i.instance_id not in before]
    cluster.send(cluster.change_message("worker", "terminate", victim.instance_id))
    gone = names.node_name(victim.address)
    wait_until(lambda: gone not in c.slurm(), 60, 0.25, "the lost node deleted from Slurm")
    log = (c.master.root / "var/log/slurm/slurmctld.log").read_text()
    assert f"lost: instance {victim.instance_id} left the membership" in log

    replacement = c.boot("worker", new_i)
    cluster.send(cluster.change_message("worker", "launch", new_i.instance_id))
    c.wait_idle([replacement])

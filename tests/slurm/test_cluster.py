"""Slurm on an emulated cluster: the stack's AWS side in moto with ``scheduler=slurm`` (the
munge key in Secrets Manager, its ARN in the user data), every node booted as the emulator
boots an instance (its IMDS, the real installer writing the Slurm units, the real agent
reading the key and writing slurm.conf from the membership it applies), the units run as
``emulator.slurm_node`` runs them. The master's agent keeps Slurm's node list to the signed
membership: a worker's machine lost is DOWN with the reason and deleted; its replacement
registers with no person."""

from __future__ import annotations

import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import names, node, reconcile
from emulator.deploy import aws_env
from emulator.nodes import Node, stop_nodes
from emulator.resources import ClusterResources, create_cluster
from tests.support.agents import wait_until
from tests.support.slurm import slurm_work
from tests.support.users import cluster_user, login_env


class SlurmCluster:
    def __init__(self, work: Path, cluster: ClusterResources) -> None:
        self.work, self.cluster = work, cluster
        self.nodes: list[Node] = []

    def boot(self, role: str, instance) -> Node:
        n = Node(instance, role, self.work / "nodes" / instance.instance_id, self.work / "efs",
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

    def applied(self, n: Node) -> int:
        try:
            return Membership.load(NodePaths(n.root).membership).generation
        except (OSError, ValueError):
            return 0


@pytest.fixture()
def slurm_cluster(moto_reset) -> Iterator[SlurmCluster]:
    with slurm_work() as work:
        c = SlurmCluster(work, create_cluster(moto_reset, workers=2, scheduler="slurm"))
        try:
            yield c
        finally:
            assert not stop_nodes(c.nodes), "processes outlived the test"


@pytest.fixture()
def user() -> Iterator[pwd.struct_passwd]:
    with cluster_user("dlslurm") as u:
        yield u


def test_a_slurm_cluster_forms_runs_srun_and_heals_its_node_list(
        slurm_cluster: SlurmCluster, user: pwd.struct_passwd) -> None:
    c, cluster = slurm_cluster, slurm_cluster.cluster
    cluster.send(cluster.setup_message("master"))
    cluster.send(cluster.setup_message("worker"))
    (master_i,) = cluster.node_instances("master")
    workers = [c.boot("worker", i) for i in cluster.node_instances("worker")]
    master = c.boot("master", master_i)
    every = [master, *workers]
    wait_until(lambda: all(c.applied(n) == 1 for n in every), 120, 0.2, "generation 1")
    names_ = [names.node_name(n.address) for n in every]
    wait_until(lambda: all("IDLE" in c.slurm().get(x, reconcile.SlurmNode(x, frozenset()))
                           .states for x in names_), 60, 0.25, "every node idle in Slurm")
    key = SlurmPaths(master.root).munge_key
    assert oct(key.stat().st_mode & 0o777) == "0o400"

    res = subprocess.run(["srun", "-N3", "sh", "-c", 'echo "$(hostname) $(id -un)"'],
                         env={**login_env(user), **c.env()}, cwd="/tmp", user=user.pw_uid,
                         group=user.pw_gid, extra_groups=[], text=True, capture_output=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == sorted(f"{x} {user.pw_name}" for x in names_)

    # a worker's machine is lost; Auto Scaling replaces it; the master publishes generation 2
    victim = workers[0]
    victim.kill([])
    c.nodes.remove(victim)
    asg = cluster.client("autoscaling")
    asg.terminate_instance_in_auto_scaling_group(InstanceId=victim.instance_id,
                                                 ShouldDecrementDesiredCapacity=False)
    (new_i,) = [i for i in cluster.node_instances("worker")
                if i.instance_id not in {n.instance_id for n in every}]
    cluster.send(cluster.change_message("worker", "terminate", victim.instance_id))
    gone = names.node_name(victim.address)
    wait_until(lambda: gone not in c.slurm(), 60, 0.25, "the lost node deleted from Slurm")
    log = (master.root / "var/log/slurm/slurmctld.log").read_text()
    assert f"lost: instance {victim.instance_id} left the membership" in log

    replacement = c.boot("worker", new_i)
    cluster.send(cluster.change_message("worker", "launch", new_i.instance_id))
    fresh = names.node_name(replacement.address)
    wait_until(lambda: "IDLE" in c.slurm().get(fresh, reconcile.SlurmNode(fresh, frozenset()))
               .states, 90, 0.25, "the replacement idle in Slurm")

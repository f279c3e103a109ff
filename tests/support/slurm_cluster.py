"""An emulated cluster with ``scheduler=slurm`` booted as the product boots it (the stack's
AWS side in moto, every node booted as the emulator boots an instance), and what its tests
do on it: run Slurm's clients as a real user of the master, read Slurm's own job records,
and cancel what they submitted so the next test finds every node idle.

:func:`booted_cluster` boots one; ``tests/slurm/test_cluster.py`` shares one among every test
of that module (a boot is a third of a minute on two cores), and the Slurm benchmarks
(``tests/slurm/test_bench.py``) boot their own."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import names, node, reconcile
from emulator import slurm_node
from emulator.deploy import aws_env
from emulator.node_network import bind_preload
from emulator.nodes import Node, stop_nodes
from emulator.resources import ClusterResources, create_cluster
from tests.support.agents import wait_until
from tests.support.slurm import slurm_work
from tests.support.users import login_env

#: The job states Slurm has not finished with.
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")


class SlurmCluster:
    """The nodes of one emulated cluster booted under ``work`` (every parent traversable:
    ``tests.support.slurm.slurm_work``)."""

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

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "worker"]

    def env(self) -> dict[str, str]:
        """Root's client environment on the master (its slurm.conf)."""
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

    def root(self, *argv: str) -> subprocess.CompletedProcess:
        """A Slurm client as root on the master."""
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                              timeout=30, check=False)

    def job(self, job: str) -> dict[str, str]:
        """Slurm's record of ``job`` (``scontrol show job -o``, as root) by field; {} once
        Slurm has forgotten it. Values with spaces (a Command's arguments) are cut at the
        first: the fields read here have none."""
        res = self.root("scontrol", "show", "job", job, "-o")
        return dict(f.split("=", 1) for f in res.stdout.split() if "=" in f)

    def job_ended(self, job: str) -> str:
        """The job's state once it ended ("" while it has not); a job Slurm held after a
        failed launch has ended for a test (it would wait for a person)."""
        res = self.root("scontrol", "show", "job", job, "-o")
        state = res.stdout.split("JobState=")[1].split()[0] if "JobState=" in res.stdout \
            else ""
        if state in LIVE_STATES or not state:
            return "HELD" if "launch failed" in res.stdout else ""
        return state

    def wait_state(self, job: str, state: str, timeout: float = 90) -> dict[str, str]:
        """The job's record once Slurm says ``state``. The bound is generous: on a loaded
        machine a node's epilog, the next job's prolog on every node and the scheduler's
        pass each take seconds (30 s was exceeded under a load of 10-20)."""
        wait_until(lambda: self.job(job).get("JobState") == state, timeout, 0.1,
                   f"job {job} {state}")
        return self.job(job)

    def slurmd_logs(self) -> str:
        return "\n".join(f"== {p}\n{p.read_text()[-2000:]}" for n in self.nodes
                         for p in (n.root / "var/log/slurm").glob("slurmd*.log"))

    def applied(self, n: Node) -> int:
        try:
            return Membership.load(NodePaths(n.root).membership).generation
        except (OSError, ValueError):
            return 0

    def submit_dir(self, u: pwd.struct_passwd) -> Path:
        return self.work / "submit" / u.pw_name


@contextlib.contextmanager
def booted_cluster(cloud, *, workers: int, instance_type: str) -> Iterator[SlurmCluster]:
    """A cluster with ``scheduler=slurm`` in the emulator's AWS ``cloud`` (reset first): the
    master and ``workers`` workers booted as EC2 boots them, formed (generation 1 applied on
    every node) and every node IDLE in Slurm. On exit, pass or fail, every process of every
    node is stopped, and a survivor fails the caller."""
    cloud.reset()
    with slurm_work() as work, pytest.MonkeyPatch.context() as mp:
        for k, v in aws_env(cloud.endpoint).items():  # no real account, ever
            mp.setenv(k, v)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        c = SlurmCluster(work, create_cluster(cloud.endpoint, workers=workers,
                                              scheduler="slurm", instance_type=instance_type))
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


def as_user(c: SlurmCluster, u: pwd.struct_passwd, *argv: str, timeout: float = 60,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``argv`` as ``u`` on the master, in their submit directory, with what a login shell
    on the emulated master has (emulator/demo/shell.py): slurm.conf and the bind preload,
    plus ``extra_env``; a login's usual umask (022), which sbatch hands its job."""
    return subprocess.run(list(argv), env={**login_env(u), **c.user_env(), **(extra_env or {})},
                          cwd=c.submit_dir(u), user=u.pw_uid, group=u.pw_gid,
                          extra_groups=[], umask=0o022, text=True, capture_output=True,
                          timeout=timeout, check=False)


def private_submit_dir(c: SlurmCluster, u: pwd.struct_passwd) -> Path:
    """``u``'s own directory to submit from, 0700 (a stand-in for theirs on EFS)."""
    home = c.submit_dir(u)
    home.mkdir(mode=0o700, parents=True)
    os.chown(home, u.pw_uid, u.pw_gid)
    return home


@contextlib.contextmanager
def jobs(c: SlurmCluster) -> Iterator[list[str]]:
    """A list to put the ids of the jobs a test submits in: on exit, pass or fail, root
    cancels every one still live and waits until each has left the nodes, so the next test
    finds the cluster idle (the shared fixture's contract)."""
    ids: list[str] = []
    try:
        yield ids
    finally:
        if ids:
            c.root("scancel", *ids)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(
                    c.job(j).get("JobState") in LIVE_STATES for j in ids):
                time.sleep(0.1)
            c.wait_idle(c.nodes)


def submit(c: SlurmCluster, u: pwd.struct_passwd, ids: list[str], *sbatch: str,
           extra_env: dict[str, str] | None = None) -> str:
    """``sbatch --parsable ...`` as ``u``; the job id, also added to ``ids``."""
    res = as_user(c, u, "sbatch", "--parsable", *sbatch, extra_env=extra_env)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    ids.append(job)
    return job


def health(asg, instance_id: str) -> str:
    """The instance's health as Auto Scaling records it (``Healthy`` / ``Unhealthy``)."""
    found = asg.describe_auto_scaling_instances(InstanceIds=[instance_id])
    return found["AutoScalingInstances"][0]["HealthStatus"] if \
        found["AutoScalingInstances"] else ""


def lose_worker(c: SlurmCluster, victim: Node):
    """``victim``'s machine lost as a kill -9 of everything on it loses it (its agent, its
    munged and slurmd, slurmstepd and the job's tasks), then what AWS does after: the
    instance terminated in its Auto Scaling group without lowering the desired capacity (so
    the group launches a replacement) and the lifecycle message the cluster gets. Returns the
    replacement's instance, not booted yet (:func:`join_replacement`)."""
    cluster = c.cluster
    before = {n.instance_id for n in c.nodes}
    victim.kill([])
    c.nodes.remove(victim)
    cluster.client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=victim.instance_id, ShouldDecrementDesiredCapacity=False)
    (new_i,) = [i for i in cluster.node_instances("worker") if i.instance_id not in before]
    cluster.send(cluster.change_message("worker", "terminate", victim.instance_id))
    return new_i


def join_replacement(c: SlurmCluster, instance) -> Node:
    """The replacement booted as EC2 boots it, and its launch told to the cluster (its slurmd
    then registers by itself)."""
    replacement = c.boot("worker", instance)
    c.cluster.send(c.cluster.change_message("worker", "launch", instance.instance_id))
    return replacement


#: train_digits' rank-0 lines (``srun -l`` puts ``<task>: `` in front of each).
START_RE = re.compile(r"start world_size=(\d+) restart=\d+ step=(\d+) epoch=(\d+) "
                      r"resumed_from=(\S+)")
EPOCH_RE = re.compile(r"\bepoch=(\d+) acc=")


@dataclass(frozen=True)
class DigitsRun:
    """One start of train_digits in a job's output, and the epochs it finished."""

    world_size: int
    step: int  # the global step it started from (0: from scratch)
    resumed_from: str  # the checkpoint's file name, "-" for none
    epochs: tuple[int, ...]


def digits_runs(text: str) -> list[DigitsRun]:
    """Each (re)start of the example in ``text``, in order, with the epochs it printed."""
    runs: list[DigitsRun] = []
    for line in text.splitlines():
        if m := START_RE.search(line):
            runs.append(DigitsRun(int(m[1]), int(m[2]), m[4], ()))
        elif (m := EPOCH_RE.search(line)) and runs:
            last = runs[-1]
            runs[-1] = DigitsRun(last.world_size, last.step, last.resumed_from,
                                 (*last.epochs, int(m[1])))
    return runs

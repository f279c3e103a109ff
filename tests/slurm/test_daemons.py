"""Slurm's real daemons from the product's own files, without the stack: munged on every node,
slurmctld on the master, slurmd on each node as a dynamic node, each node at its own 127.x
address (``tests/support/slurm.py``). A real unprivileged user's ``srun -N2`` runs on two
nodes; a node that leaves the membership is DOWN with the reason and deleted by the master's
reconcile; a new node joins by itself."""

from __future__ import annotations

import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import alive
from bootstrap_scripts.slurm import reconcile
from emulator import slurm_node
from emulator.node_network import bind_preload
from emulator.resources import loopback_instances
from tests.support.agents import wait_until
from tests.support.slurm import SlurmNodes, slurm_work
from tests.support.users import cluster_user, login_env


@pytest.fixture()
def slurm(tmp_path: Path) -> Iterator[SlurmNodes]:
    with slurm_work() as work:
        nodes = SlurmNodes(work, bind_preload(tmp_path / "lib"))
        try:
            yield nodes
        finally:
            assert not nodes.stop(), "Slurm processes outlived the test"


@pytest.fixture()
def user() -> Iterator[pwd.struct_passwd]:
    with cluster_user("dlslurm") as u:
        yield u


def as_user(u: pwd.struct_passwd, slurm: SlurmNodes, *argv: str, timeout: float = 60
            ) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env={**login_env(u), **slurm.env()}, cwd="/tmp",
                          user=u.pw_uid, group=u.pw_gid, extra_groups=[], text=True,
                          capture_output=True, timeout=timeout, check=False)


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def running_job(address: str) -> set[int] | None:
    """The node's Slurm processes once its job's ``sleep`` runs among them, else None."""
    procs = slurm_node.processes(address)
    return procs if any(cmdline(p).startswith(b"sleep") for p in procs) else None


def idle(*names: str):
    return lambda listed: all(n in listed and "IDLE" in listed[n].states for n in names)


def test_dynamic_nodes_register_run_a_users_srun_and_follow_the_membership(
        slurm: SlurmNodes, user: pwd.struct_passwd) -> None:
    master_i, a_i, b_i, c_i = loopback_instances(4)
    master = slurm.add("master", master_i.address)
    a = slurm.add("worker", a_i.address, gpus=2)
    b = slurm.add("worker", b_i.address)
    m = slurm.publish()
    for n in (master, a, b):
        slurm.start(n)
    listed = slurm.wait_nodes(idle(master.name, a.name, b.name), "three nodes idle")
    assert "DYNAMIC_NORM" in listed[a.name].states
    reconciler = slurm.reconciler()  # the master agent's, across its memberships
    assert reconciler.run(m) == []

    # a real user's srun on two workers, each task on its own node under the node's name
    res = as_user(user, slurm, "srun", "-N2", "-p", "workers", "sh", "-c",
                  'echo "$(hostname) $(id -un) $SLURM_JOB_NUM_NODES"')
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split("\n")[:-1]) == sorted(
        f"{n.name} {user.pw_name} 2" for n in (a, b))
    # the GPUs are GRES from the node's own count
    res = as_user(user, slurm, "srun", "-N1", "--gres=gpu:2", "sh", "-c", "hostname")
    assert (res.returncode, res.stdout.strip()) == (0, a.name), res.stderr

    # b's machine is lost in the middle of a job on a and b whose task on a takes 3 s to end
    # after Slurm's SIGTERM: every process of b's Slurm goes with it (slurmstepd and the
    # job's task too); it leaves the membership; the master's reconcile marks it DOWN with
    # the reason at once, and deletes it only once the job has ended on a (22.05's
    # slurmctld dies of a node deleted while a job that had it is still COMPLETING)
    lingers = "trap 'sleep 3; exit 0' TERM; sleep 600 & wait"
    res = as_user(user, slurm, "sbatch", "-N2", "-w", f"{a.name},{b.name}", "--no-requeue",
                  "--output", "/dev/null", "--wrap",
                  f"trap 'sleep 3' TERM; srun sh -c \"{lingers}\"")
    assert res.returncode == 0, res.stderr
    job = res.stdout.split()[-1]

    # allocated first, then the prolog on each node, then the batch script (DeferBatch)
    wait_until(lambda: running_job(a.address) and running_job(b.address), 60, 0.1,
               "the job's tasks on a and b")
    machine = slurm_node.processes(b.address)
    slurm.lose(b)
    assert not [p for p in machine if alive(p)], "a process of the lost machine lives on"
    m = slurm.publish()
    done = reconciler.run(m)
    reason = f"lost: instance {b.instance_id} left the membership (generation {m.generation})"
    assert [(x.kind, x.node, x.reason) for x in done or []] == [
        (reconcile.DOWN, b.name, reason)]
    listed = slurm.wait_nodes(lambda listed: b.name in listed, "b listed")
    assert "DOWN" in listed[b.name].states
    assert reason in (master.root / "var/log/slurm/slurmctld.log").read_text()
    def state() -> str:
        return as_user(user, slurm, "squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout
    wait_until(lambda: state().strip() == "NODE_FAIL", 60, 0.2, "the job ended")
    assert [(x.kind, x.node) for x in reconciler.run(m) or []] == [(reconcile.DELETE, b.name)]
    assert b.name not in {x.name for x in slurm.slurm_nodes() or []}

    # a replacement joins with no person: it registers as a dynamic node
    c = slurm.add("worker", c_i.address)
    m = slurm.publish()
    slurm.start(c)
    slurm.wait_nodes(idle(master.name, a.name, c.name), "the replacement idle")
    assert reconciler.run(m) == []
    res = as_user(user, slurm, "srun", "-N2", "-p", "workers", "hostname")
    assert sorted(res.stdout.split()) == sorted([a.name, c.name]), res.stderr
    # a job left running: the fixture's shutdown must stop its slurmstepd and task too
    res = as_user(user, slurm, "sbatch", "-w", a.name, "--wrap", "sleep 600", "--output",
                  "/dev/null")
    assert res.returncode == 0, res.stderr
    slurm.wait_nodes(lambda listed: {"ALLOCATED", "MIXED"} & listed[a.name].states,
                     "a running a job")

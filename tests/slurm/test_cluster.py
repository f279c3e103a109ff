"""Slurm on an emulated cluster: the stack's AWS side in moto with ``scheduler=slurm`` (the
munge key in Secrets Manager, its ARN in the user data), every node booted as the emulator
boots an instance (its IMDS, the real installer writing the Slurm units, the real agent
reading the key and writing slurm.conf from the membership it applies), the units run as
``emulator.slurm_node`` runs them. The master's agent keeps Slurm's node list to the signed
membership: a worker's machine lost is DOWN with the reason and deleted; its replacement
registers with no person. Two real users share it: neither can touch nor read the other's
job, their jobs queue by priority, and their half-node GPU jobs share a node."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import config, names
from emulator.gpus import inject_gpu_fault
from emulator.node_inputs import PYTHON
from tests.conftest import REPO_ROOT
from tests.support.agents import wait_until
from tests.support.slurm_cluster import (
    SlurmCluster,
    as_user,
    booted_cluster,
    digits_runs,
    health,
    jobs,
    join_replacement,
    lose_worker,
    private_submit_dir,
    submit,
)
from tests.support.users import cluster_user, reachable

SBATCH = Path(REPO_ROOT) / "bootstrap_scripts/examples/train_digits.sbatch"
#: The cluster's instance type: 4 GPUs (as EC2 describes a g5.12xlarge), so two half-node
#: jobs can share a node.
INSTANCE_TYPE = "g5.12xlarge"
GPUS = 4


@pytest.fixture(scope="module")
def slurm_cluster(emulator_cloud) -> Iterator[SlurmCluster]:
    """Three nodes (the master and two workers, four GPUs each), formed, every one idle in
    Slurm; shared by the tests below, which leave three nodes idle."""
    with booted_cluster(emulator_cloud, workers=2, instance_type=INSTANCE_TYPE) as c:
        yield c


@pytest.fixture(scope="module")
def user(slurm_cluster: SlurmCluster) -> Iterator[pwd.struct_passwd]:
    """A real user of the master, with a private directory of their own to submit from (a
    stand-in for theirs on EFS), who can run this checkout's Python (as on a DLAMI)."""
    with cluster_user("dlslurm") as u, reachable(os.path.realpath(PYTHON), PYTHON, REPO_ROOT):
        private_submit_dir(slurm_cluster, u)
        yield u


@pytest.fixture(scope="module")
def other(slurm_cluster: SlurmCluster) -> Iterator[pwd.struct_passwd]:
    """A second real user of the master, with a private submit directory of their own."""
    with cluster_user("dlslurmb") as u:
        private_submit_dir(slurm_cluster, u)
        yield u


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
    deadline = time.monotonic() + 240  # a bound for a hang, not a speed goal
    while not (state := c.job_ended(job)) and time.monotonic() < deadline:
        time.sleep(0.5)
    text = out.read_text() if out.exists() else "(no output file)"
    assert state == "COMPLETED", f"{state or 'still running'}\n{text}\n{c.slurmd_logs()}"
    assert "start world_size=3" in text, text
    final = [line for line in text.splitlines() if "final acc=" in line]
    assert final, text
    acc = float(final[0].split("final acc=")[1].split()[0])
    assert acc >= 0.9, text


def test_another_user_can_neither_touch_nor_read_a_users_job(
        slurm_cluster: SlurmCluster, user: pwd.struct_passwd, other: pwd.struct_passwd) -> None:
    """docs/security.md L43: user B tries user A's running and pending jobs with every
    client a user has; each is refused by slurmctld (or the file system) and A's jobs are
    as they were. A's own ``srun --jobid`` into the same job works, and root and the
    SlurmUser can do what B could not."""
    c = slurm_cluster
    secret = f"tok-{secrets.token_hex(8)}"
    with jobs(c) as ids:
        running = submit(c, user, ids, "--job-name=private", "--output=private_%j.out",
                         "--wrap", 'echo "token=$A_TOKEN"; sleep 120',
                         extra_env={"A_TOKEN": secret})
        pending = submit(c, user, ids, "--begin=now+3600", "--wrap", "true")
        before = c.wait_state(running, "RUNNING")
        out = c.submit_dir(user) / f"private_{running}.out"
        wait_until(lambda: out.exists() and secret in out.read_text(), 30, 0.1,
                   "A's output written")
        # Slurm makes the output readable by all (the submitter's umask): A's 0700
        # directory is what keeps it from B
        assert (c.submit_dir(user).stat().st_mode & 0o777, out.stat().st_mode & 0o777,
                out.stat().st_uid) == (0o700, 0o644, user.pw_uid)

        mine = as_user(c, user, "srun", f"--jobid={running}", "--overlap", "id", "-un")
        assert (mine.returncode, mine.stdout.strip()) == (0, user.pw_name), mine.stderr

        denied = "Access/permission denied"
        attempts = {
            "scancel running": (("scancel", running), denied),
            "scancel pending": (("scancel", pending), denied),
            "hold": (("scontrol", "hold", pending), "Invalid user id"),
            "update": (("scontrol", "update", f"JobId={running}", "TimeLimit=1"),
                       "Invalid user id"),
            "requeue": (("scontrol", "requeue", running), denied),
            "srun into": (("srun", f"--jobid={running}", "--overlap", "id", "-un"), denied),
            "batch script": (("scontrol", "write", "batch_script", running, "stolen.sh"),
                             "retrieval failed: Invalid user id"),
            "output": (("cat", str(out)), "Permission denied"),
        }
        tried = {what: as_user(c, other, *argv, timeout=30)
                 for what, (argv, _) in attempts.items()}
        # 22.05's `scontrol write batch_script` exits 0 on a refusal: its message and the
        # file it did not write say it
        assert all((res.returncode != 0 or what == "batch script")
                   and attempts[what][1] in res.stderr and secret not in res.stdout + res.stderr
                   for what, res in tried.items()), "\n".join(
            f"{what}: {r.returncode} {r.stdout!r} {r.stderr!r}" for what, r in tried.items())
        assert not (c.submit_dir(other) / "stolen.sh").exists()
        shown = as_user(c, other, "scontrol", "-dd", "show", "job", running)
        assert shown.returncode == 0 and secret not in shown.stdout, shown

        after = c.job(running)
        assert {k: after.get(k) for k in ("JobState", "StartTime", "TimeLimit", "Restarts")} \
            == {k: before.get(k) for k in ("JobState", "StartTime", "TimeLimit", "Restarts")}
        assert c.job(pending).get("JobState") == "PENDING"
        assert c.job(pending).get("Priority") != "0", "B's hold took"

        script = c.work / "root-read.sh"
        assert c.root("scontrol", "write", "batch_script", running, str(script)).returncode == 0
        assert "sleep 120" in script.read_text()
        assert c.root("scontrol", "hold", pending).returncode == 0
        assert c.job(pending).get("Priority") == "0"
        released = subprocess.run(["scontrol", "release", pending], env=c.env(),
                                  user=config.SLURM_USER, capture_output=True, text=True,
                                  timeout=30, check=False)
        assert released.returncode == 0, released.stderr
        assert c.job(pending).get("Priority") != "0"
        assert c.root("scancel", running, pending).returncode == 0
        assert c.wait_state(running, "CANCELLED")


def test_two_users_jobs_queue_and_run_by_priority(
        slurm_cluster: SlurmCluster, user: pwd.struct_passwd, other: pwd.struct_passwd) -> None:
    """With every node held, A submits a job with ``--nice`` and then B one without: ``sprio``
    shows B's ahead, and when the holder ends B's starts first, though A's came first
    (Slurm's own start and end times)."""
    c = slurm_cluster
    text = ("-N", str(len(c.nodes)), "--exclusive")
    with jobs(c) as ids:
        holder = submit(c, user, ids, *text, "--output=/dev/null", "--wrap", "sleep 120")
        c.wait_state(holder, "RUNNING")
        first = submit(c, user, ids, *text, "--nice=100", "--output=/dev/null",
                       "--wrap", "sleep 1")
        second = submit(c, other, ids, *text, "--output=/dev/null", "--wrap", "sleep 1")
        # what either user sees of why the queue is in this order (priority/multifactor's)
        shown = as_user(c, other, "sprio", "-h", "-o", "%i %Y")
        assert shown.returncode == 0, shown.stderr
        prio = dict(line.split() for line in shown.stdout.splitlines())
        assert int(prio[second]) > int(prio[first]), prio
        assert as_user(c, user, "scancel", holder).returncode == 0
        done = {j: c.wait_state(j, "COMPLETED") for j in (second, first)}
    starts = {j: done[j]["StartTime"] for j in done}
    assert done[second]["StartTime"] < done[first]["StartTime"], starts
    assert done[first]["StartTime"] >= done[second]["EndTime"], done


def test_two_users_half_node_gpu_jobs_share_one_node(
        slurm_cluster: SlurmCluster, user: pwd.struct_passwd, other: pwd.struct_passwd) -> None:
    """Two users' jobs of half a node's GPUs each run at once on one node, each with GPUs of
    its own (Slurm's allocation, and the CUDA_VISIBLE_DEVICES the job sees)."""
    c = slurm_cluster
    target = names.node_name(c.workers[0].address)
    half = f"--gres=gpu:{GPUS // 2}"
    show = 'echo "gpus=$CUDA_VISIBLE_DEVICES"; sleep 60'
    with jobs(c) as ids:
        a = submit(c, user, ids, "-w", target, half, "--output=gpus_%j.out", "--wrap", show)
        b = submit(c, other, ids, "-w", target, half, "--output=gpus_%j.out", "--wrap", show)
        records = {j: c.wait_state(j, "RUNNING") for j in (a, b)}
        assert all(r["JobState"] == "RUNNING" for r in map(c.job, (a, b)))  # at once
        assert {r["NodeList"] for r in records.values()} == {target}
        seen = {}
        for j, u in ((a, user), (b, other)):
            out = c.submit_dir(u) / f"gpus_{j}.out"
            wait_until(lambda out=out: out.exists() and "gpus=" in out.read_text(), 30, 0.1,
                       f"job {j}'s output")
            seen[j] = out.read_text().split("gpus=")[1].split()[0].split(",")
        assert all(len(g) == GPUS // 2 for g in seen.values()), seen
        assert sorted(seen[a] + seen[b]) == [str(i) for i in range(GPUS)], seen
        detail = {j: c.root("scontrol", "-d", "show", "job", j).stdout for j in (a, b)}
        idx = {j: t.split("(IDX:")[1].split(")")[0] for j, t in detail.items()}
        assert idx[a] != idx[b], idx


def test_a_node_failing_the_prolog_is_drained_with_the_check_named_and_the_job_runs(
        slurm_cluster: SlurmCluster, user: pwd.struct_passwd) -> None:
    """A worker's GPU driver fails (its stand-in nvidia-smi, as the demo's
    ``--unhealthy-node``). A two-node job is allocated on it: the Prolog's checks fail there,
    the node drains itself with the check named, Slurm requeues the job (not held) and it
    runs to COMPLETED on two healthy nodes; the master agent marks the sick instance, and
    no other, Unhealthy in Auto Scaling. The master is held by another job while the first
    allocation is made, so that it takes the sick worker (the test's only hand in the
    scheduling); the holder's end frees the master for the requeued job.

    docs/security.md L44: the job is submitted with an environment and a working directory
    that would run the user's code in any Python that trusted them (``PYTHONPATH``, a
    ``sitecustomize.py`` where it starts): the root prolog on every node loads none of it;
    and the user cannot drain a node with a health reason of their own. The node is healed
    and resumed at the end (the fixture's three idle nodes)."""
    c = slurm_cluster
    sick, healthy = c.workers[-1], c.workers[0]
    sick_name, master_name = names.node_name(sick.address), names.node_name(c.master.address)
    asg = c.cluster.client("autoscaling")
    bait = c.submit_dir(user) / "sitecustomize.py"
    bait.write_text("import os, pathlib\npathlib.Path(__file__).with_name("
                    "f'loaded-by-{os.getuid()}').touch()\n")
    os.chown(bait, user.pw_uid, user.pw_gid)
    lure = {"PYTHONPATH": str(bait.parent), "PYTHONSTARTUP": str(bait),
            "BASH_ENV": str(bait), "ENV": str(bait)}
    fake = as_user(c, user, "scontrol", "update", f"NodeName={names.node_name(healthy.address)}",
                   "State=DRAIN", "Reason=dl-health: nvidia-smi exit 9")
    assert fake.returncode != 0 and not c.slurm()[names.node_name(healthy.address)].draining, \
        fake
    fault = inject_gpu_fault(sick.root, "the prolog drill")
    try:
        with jobs(c) as ids:
            holder = submit(c, user, ids, "-w", master_name, "--exclusive",
                            "--output=/dev/null", "--wrap", "sleep 300")
            c.wait_state(holder, "RUNNING")
            job = submit(c, user, ids, "-N2", "--output=prolog_%j.out", "--wrap",
                         "srun -l hostname", extra_env=lure)
            wait_until(lambda: c.slurm()[sick_name].draining, 60, 0.2, "the sick worker drained")
            drained = c.slurm()[sick_name]
            assert (drained.reason, drained.reason_user) == (
                "dl-health: nvidia-smi exit 9; dcgm exit 9", "root"), drained
            wait_until(lambda: c.job(job).get("JobState") == "PENDING"
                       and c.job(job).get("Restarts") == "1", 60, 0.2, "the job requeued")
            assert c.job(job).get("Priority") != "0", "the requeued job was held"
            wait_until(lambda: health(asg, sick.instance_id) == "Unhealthy", 60, 0.25,
                       "the sick instance marked Unhealthy")
            assert {health(asg, n.instance_id) for n in c.nodes if n is not sick} \
                == {"Healthy"}
            # Slurm starts a requeued job no sooner than cred_expire + 1 s after the requeue
            # (config.CRED_EXPIRE_S); the holder ends after that, so its end's scheduling
            # pass starts the job (else the next periodic pass would, up to 30 s later)
            eligible = datetime.fromisoformat(c.job(job)["EligibleTime"]).timestamp()
            time.sleep(max(0.0, eligible + 1 - time.time()))
            assert as_user(c, user, "scancel", holder).returncode == 0
            done = c.wait_state(job, "COMPLETED", timeout=90)
            out = (c.submit_dir(user) / f"prolog_{job}.out").read_text()
        assert sorted(line.split()[-1] for line in out.splitlines()) == sorted(
            [master_name, names.node_name(healthy.address)]), out
        assert done["Restarts"] == "1", done
        runs = {n.role + n.address: (n.root / "var/log/slurm/dl-health-prolog.log").read_text()
                for n in (sick, c.master)}
        assert f"job={job} FAIL" in runs["worker" + sick.address], runs
        assert f"job={job} ok" in runs["master" + c.master.address], runs
        assert not (bait.parent / "loaded-by-0").exists(), "a root prolog ran the user's code"
    finally:
        fault.unlink(missing_ok=True)
        asg.set_instance_health(InstanceId=sick.instance_id, HealthStatus="Healthy")
        c.root("scontrol", "update", f"NodeName={sick_name}", "State=RESUME")
        c.wait_idle(c.nodes)


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



def test_a_requeue_job_resumes_from_its_checkpoint_when_its_rendezvous_host_is_lost(
        slurm_cluster: SlurmCluster, user: pwd.struct_passwd) -> None:
    """Auto-resume (issue 43): the DDP recipe submitted unchanged with ``sbatch --requeue``
    on the two workers; once its first epoch's checkpoint is on disk, the machine of the
    allocation's first node (the torchrun rendezvous host: HyperPod's auto-resume breaks
    when that is the node lost) is killed -9 and terminated. The master agent marks it DOWN
    with the reason; Slurm requeues the job, not held, under the same id; the replacement
    joins and the job runs again on the survivor and the replacement (the recipe computes
    its rendezvous host from that allocation) and resumes from the checkpoint: epoch 1 is not
    trained again; it completes at the accuracy; one job record, ``Restarts=1``. A batch
    job is one Slurm would run again by default (``JobRequeue=1``), and ``--no-requeue``
    opts one out.
    docs/slurm.md, "A lost node", says what "no step runs twice" means for a requeued job."""
    c = slurm_cluster
    ctld_log = c.master.root / "var/log/slurm/slurmctld.log"
    with jobs(c) as ids:
        plain = submit(c, user, ids, "--hold", "--output=/dev/null", "--wrap", "true")
        opted_out = submit(c, user, ids, "--hold", "--no-requeue", "--output=/dev/null",
                           "--wrap", "true")
        assert (c.job(plain).get("Requeue"), c.job(opted_out).get("Requeue")) == ("1", "0")
        assert c.root("scancel", plain, opted_out).returncode == 0
        # on the workers only, so its rendezvous host is a worker (the drill does not lose
        # the master); sbatch's options override the script's #SBATCH lines
        job = submit(c, user, ids, "--requeue", "--partition=workers", "--nodes=2",
                     str(SBATCH), "--epochs", "5", "--step-delay", "0.05")
        first = c.wait_state(job, "RUNNING", 60)
        assert (first["Requeue"], first["Restarts"]) == ("1", "0"), first
        hosts = c.root("scontrol", "show", "hostnames", first["NodeList"]).stdout.split()
        head = hosts[0]  # the recipe's rendezvous host
        victim = next(n for n in c.workers if names.node_name(n.address) == head)
        out = c.submit_dir(user) / f"digits-ddp_{job}.out"
        latest = c.submit_dir(user) / "checkpoints" / f"digits-ddp-{job}" / "latest.json"

        def saved() -> dict:
            try:
                return json.loads(latest.read_text())
            except (OSError, ValueError):
                return {}
        # mid-training: epoch 1 finished and its checkpoint is on disk (a bound for a hang)
        wait_until(lambda: saved().get("file") == "epoch-0001.pt" or saved().get("epoch", 0) > 1
                   or bool(c.job_ended(job)), 240, 0.05, "epoch 1's checkpoint")
        kept = saved()
        assert not c.job_ended(job), out.read_text()
        new_i = lose_worker(c, victim)

        wait_until(lambda: c.job(job).get("Restarts") == "1", 60, 0.1, "the job requeued")
        requeued = c.wait_state(job, "PENDING", 60)
        assert requeued["JobId"] == job and requeued["Priority"] != "0", requeued  # not held
        log = ctld_log.read_text()
        assert (f"node {head} reason set to: lost: instance {victim.instance_id} left the "
                f"membership") in log
        assert f"requeue job JobId={job} due to failure of node {head}" in log
        before = out.read_text()  # the first run's output, before the second starts

        replacement = join_replacement(c, new_i)
        deadline = time.monotonic() + 240  # a bound for a hang, not a speed goal
        while not (state := c.job_ended(job)) and time.monotonic() < deadline:
            time.sleep(0.5)
        text = out.read_text() if out.exists() else "(no output file)"
        assert state == "COMPLETED", f"{state or 'still running'}\n{before}\n--\n{text}\n" \
            f"{c.slurmd_logs()}"
        done = c.job(job)
        again = set(c.root("scontrol", "show", "hostnames", done["NodeList"]).stdout.split())
        survivor = next(n for n in c.workers if n is not replacement)
        assert (done["JobId"], done["Restarts"]) == (job, "1"), done
        assert again == {names.node_name(n.address) for n in (survivor, replacement)}, done
        listed = c.root("squeue", "--states=all", "--noheader", "--format=%i",
                        f"--user={user.pw_name}").stdout.split()
        assert listed.count(job) == 1, listed  # one record, no second job

    # the recipe's --open-mode=append: the first run's output is kept
    assert text.startswith(before), f"{before}\n--\n{text}"
    runs = digits_runs(text)
    assert [r.world_size for r in runs] == [2, 2], text
    assert (runs[0].step, runs[0].resumed_from) == (0, "-"), text
    # the second run started from a checkpoint at least as new as the one on disk before
    # the loss: nothing that was checkpointed is trained again, epoch 1 not at all
    assert runs[1].resumed_from != "-" and runs[1].step >= kept["global_step"], (kept, text)
    # (the first run's own "epoch=1" line may be lost with the node: its rank 0 can be the
    # killed head's task, whose last output dies with it; the checkpoint on disk is the proof
    # that epoch 1 was trained)
    assert 1 not in runs[1].epochs, text
    assert runs[1].epochs == tuple(range(runs[1].epochs[0], 6)), text
    final = [line for line in text.splitlines() if "final acc=" in line]
    assert len(final) == 1 and float(final[0].split("final acc=")[1].split()[0]) >= 0.9, text

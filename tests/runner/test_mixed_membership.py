"""A cluster of mixed instance types (an instance-type fallback list launched the next type
for some nodes): every node's type and GPU count travel in the membership, and every
launcher sizes each node by its own GPUs (docs/capacity.md)."""

from __future__ import annotations

from bootstrap_scripts.jobs.engine import launchers as ln
from bootstrap_scripts.protocol import node_files
from bootstrap_scripts.protocol.membership import Membership, build_membership


def mixed() -> Membership:
    """p5 master (8 GPUs), one p5 and one p4d worker (8 GPUs each), one g5.12xlarge
    worker (4 GPUs), one CPU worker (0 GPUs: one process)."""
    return build_membership(
        cluster_id="c", generation=1,
        master={"instance_id": "i-m", "address": "10.0.0.4", "gpus": 8,
                "instance_type": "p5.48xlarge"},
        workers=[
            {"instance_id": "i-1", "address": "10.0.1.5", "gpus": 8,
             "instance_type": "p5.48xlarge"},
            {"instance_id": "i-2", "address": "10.0.1.6", "gpus": 8,
             "instance_type": "p4d.24xlarge"},
            {"instance_id": "i-3", "address": "10.0.1.7", "gpus": 4,
             "instance_type": "g5.12xlarge"},
            {"instance_id": "i-4", "address": "10.0.1.8", "gpus": 0,
             "instance_type": "m7i.large"},
        ])


def test_membership_carries_each_nodes_type_and_gpus_through_json() -> None:
    m = Membership.from_json(mixed().to_json())
    assert [(n.instance_type, n.gpus, n.slots) for n in m.nodes] == [
        ("p5.48xlarge", 8, 8), ("p5.48xlarge", 8, 8), ("p4d.24xlarge", 8, 8),
        ("g5.12xlarge", 4, 4), ("m7i.large", 0, 1)]


def test_hostfiles_give_each_node_its_own_slots() -> None:
    m = mixed()
    assert node_files.render_mpi_hostfile(m) == (
        "10.0.0.4 slots=8\n10.0.1.5 slots=8\n10.0.1.6 slots=8\n10.0.1.7 slots=4\n"
        "10.0.1.8 slots=1\n")
    assert node_files.render_horovod_hosts(m).split() == [
        "10.0.0.4:8", "10.0.1.5:8", "10.0.1.6:8", "10.0.1.7:4", "10.0.1.8:1"]
    envs = [node_files.node_environment(m, n) for n in m.nodes]
    assert [e["DEEPLEARNING_WORKER_GPU_COUNT"] for e in envs] == ["8", "8", "8", "4", "0"]


def test_torchrun_runs_as_many_processes_as_each_node_has_gpus() -> None:
    plan = ln.plan("torchrun", mixed(), ["train.py"],
                   ln.LaunchOptions(job_id="j", job_dir="/efs/jobs/j", python="python3"))
    nproc = [next(a for a in share.procs[0].argv if a.startswith("--nproc-per-node="))
             for share in plan.shares]
    assert nproc == ["--nproc-per-node=8", "--nproc-per-node=8", "--nproc-per-node=8",
                     "--nproc-per-node=4", "--nproc-per-node=1"]


def test_mpi_and_horovod_start_the_sum_of_the_slots() -> None:
    m = mixed()
    opts = ln.LaunchOptions(job_id="j", job_dir="/efs/jobs/j", python="python3")
    assert ln.total_slots(m) == 29
    for launcher in ("mpi", "horovod"):
        (share,) = ln.plan(launcher, m, ["train.py"], opts).shares
        argv = list(share.procs[0].argv)
        assert argv[argv.index("-np") + 1] == "29", launcher

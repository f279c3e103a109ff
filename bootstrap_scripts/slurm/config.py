"""slurm.conf, gres.conf and cgroup.conf for the cluster's nodes (pure renderers).

Every node renders the same slurm.conf from the same inputs: the cluster's id, the master's
address in the signed membership, and the node's root and EFS mount point (``/`` and
``/efs`` on EC2, so the files are byte-identical there and slurmctld's check of each
registering node's configuration hash holds). slurmd reads the node's own copy (``-f``);
the controller also serves it (``enable_configless``) to any client started with
``--conf-server``.

Nodes are Slurm dynamic nodes (22.05 and later: ``slurmd -Z``): slurm.conf lists none.
``MaxNodeCount`` bounds how many may register, and the partitions take them through node sets
by feature (each node's role and instance type, :mod:`.names`), so a replacement joins with no
change here and no ``scontrol reconfigure``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from bootstrap_scripts.jobs.engine.root_env import SYSTEM_PATH
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import names

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
#: The daemons' unprivileged user (Debian's package makes it); slurmctld drops to it.
SLURM_USER = "slurm"
#: How many dynamic nodes the controller accepts; the cluster's node bound is far below.
DEFAULT_MAX_NODES = 4096
#: The priority every job starts from (``PriorityWeightPartition``: each partition's factor
#: is 1); ``sbatch --nice=N`` takes N off it, down to 1.
PRIORITY_BASE = 10000
#: Seconds a job's step credential stays valid (``AuthInfo=cred_expire``), which is also how
#: long Slurm holds a requeued job back before it may start again (22.05 sets its begin time
#: to now + this + 1 s: Slurm's default, 120 s, would keep a job requeued after a failed
#: prolog or a lost node off the cluster for two minutes). ParallelCluster sets 70 s; 30 s is
#: what SchedMD's own test suite runs with. It must stay above how long a credential takes
#: from slurmctld to a node's slurmd: a credential is made when a batch script or a step is
#: launched, after the prolog ran on every node (``PrologFlags=Alloc,DeferBatch``), and
#: slurmd checks it on receipt, seconds later even on a loaded node.
CRED_EXPIRE_S = 30
#: The main scheduler's full pass (``sched_interval``, Slurm's default 60 s): a requeued job
#: whose begin time passes is started by the next one (no event does it), each pass bounded
#: by ``max_sched_time``.
SCHED_INTERVAL_S = 10
#: How long slurmctld may put off scheduling a submitted batch job (``batch_sched_delay``,
#: Slurm's default 3 s, meant for sites taking many submissions a second): measured here, a
#: job on an idle cluster waited 2.7-2.9 s PENDING with the default, and submit -> RUNNING
#: went from 2.8 s to 0.7 s with 0 (``make bench``, tests/slurm/test_bench.py). A training
#: cluster takes a few submissions a minute; each one costs a scheduling attempt.
BATCH_SCHED_DELAY_S = 0
#: Slurm's partitions: every node that trains (the master trains too), and the workers only.
PARTITIONS = (("train", ("masters", "workers"), True), ("workers", ("workers",), False))
NODE_SETS = (("masters", "master"), ("workers", "worker"))
_CLUSTER_NAME_RE = re.compile(r"[^a-z0-9_]")
#: Seconds Slurm lets the prolog run before it kills it, drains the node and requeues the
#: job: above the prolog's own bound (``prolog.bound()``: the longest check budget, dcgm's,
#: plus slack), so the prolog's own verdict, naming the check, is the one that counts.
PROLOG_EPILOG_TIMEOUT = 180


class ConfigError(ValueError):
    """An input the renderers refuse; the message names it."""


def cluster_name(cluster_id: str) -> str:
    """Slurm's ``ClusterName``: lower case, letters, digits and ``_`` (Slurm lowers it and
    accounting uses it as a table name), at most 40 characters."""
    name = _CLUSTER_NAME_RE.sub("_", cluster_id.lower())[:40].strip("_")
    if not name:
        raise ConfigError(f"no Slurm cluster name in the cluster id {cluster_id!r}")
    return name


@dataclass(frozen=True)
class SlurmConfig:
    """What slurm.conf is rendered from."""

    cluster_id: str
    #: The master's private address (the membership's rank 0).
    controller_address: str
    root: str = "/"
    efs: str = "/efs"
    max_nodes: int = DEFAULT_MAX_NODES

    def __post_init__(self) -> None:
        names.node_name(self.controller_address)  # refuses a malformed address
        if not 1 <= self.max_nodes <= 65533:
            raise ConfigError(f"max_nodes must be 1..65533, got {self.max_nodes}")

    @property
    def controller_name(self) -> str:
        return names.node_name(self.controller_address)

    @property
    def paths(self) -> SlurmPaths:
        return SlurmPaths(self.root, self.efs)


def render_slurm_conf(c: SlurmConfig) -> str:
    p = c.paths
    node_sets = [f"NodeSet={name} Feature={feature}" for name, feature in NODE_SETS]
    partitions = [f"PartitionName={name} Nodes={','.join(sets)} "
                  f"Default={'YES' if default else 'NO'} MaxTime=INFINITE State=UP"
                  for name, sets, default in PARTITIONS]
    lines = [
        "# Rendered by the node agent (bootstrap_scripts/slurm/config.py) from the signed",
        "# membership; the same on every node. Nodes are dynamic (slurmd -Z): none listed.",
        f"ClusterName={cluster_name(c.cluster_id)}",
        f"SlurmctldHost={c.controller_name}({c.controller_address})",
        "SlurmctldParameters=enable_configless",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        f"SlurmUser={SLURM_USER}",
        "AuthType=auth/munge",
        "# a step credential lives cred_expire s; a requeued job waits as long + 1 s before it",
        "# may start again (Slurm's default 120 s: two minutes of a cluster idle per fault)",
        f"AuthInfo=socket={p.munge_socket},cred_expire={CRED_EXPIRE_S}",
        "CredType=cred/munge",
        f"StateSaveLocation={p.state_dir}",
        f"SlurmdSpoolDir={p.spool_dir}",
        f"SlurmctldPidFile={p.run_dir}/slurmctld.pid",
        f"SlurmdPidFile={p.run_dir}/slurmd-%n.pid",
        f"SlurmctldLogFile={p.log_dir}/slurmctld.log",
        f"SlurmdLogFile={p.log_dir}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        f"TaskProlog={p.task_prolog}",
        "# the health gate: the node's checks as root when a job is allocated, on every node",
        "# of it, and the batch script only once all passed; a failing node drains itself",
        "# (its reason names the check) and the job is requeued, not held, onto other nodes",
        f"Prolog={p.prolog}",
        "PrologFlags=Alloc,DeferBatch",
        f"PrologEpilogTimeout={PROLOG_EPILOG_TIMEOUT}",
        "SchedulerType=sched/backfill",
        "# one line (Slurm reads the last): a job requeued by a failed prolog is pending, not",
        "# held; the main scheduler's pass every sched_interval s starts a requeued job whose",
        "# hold ran out (no event does); a submitted batch job is scheduled at once (Slurm's",
        "# default puts it off up to 3 s, for sites that take many submissions a second)",
        f"SchedulerParameters=nohold_on_prolog_fail,sched_interval={SCHED_INTERVAL_S},"
        f"batch_sched_delay={BATCH_SCHED_DELAY_S}",
        "# a queue by priority, not by arrival alone: every job starts from the partition's",
        "# weight, so a user's --nice puts their job behind others'; job age and fair share",
        "# weigh in once slurmdbd keeps usage (without it Slurm ignores their weights)",
        "PriorityType=priority/multifactor",
        f"PriorityWeightPartition={PRIORITY_BASE}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        f"MaxNodeCount={c.max_nodes}",
        "# dynamic nodes: the controller talks to each node directly (no slurmd fan-out tree)",
        "TreeWidth=65533",
        "# a node that registers again after a DOWN it did not cause returns to service",
        "ReturnToService=2",
        "# Slurm's default, as on ParallelCluster: a batch job runs again (from the top, same",
        "# job id) when a node of its allocation fails, or when a node's prolog (the health",
        "# gate) fails before the script started; sbatch --no-requeue opts a job out",
        "JobRequeue=1",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MailProg=/bin/true",
        *node_sets,
        *partitions,
    ]
    return "\n".join(lines) + "\n"


def render_gres_conf(gpus: int, root: str = "/") -> str:
    """This node's GPUs as GRES: ``/dev/nvidia0`` .. ``/dev/nvidia<N-1>`` under its root.
    Slurm 22.05 drops a GPU without a ``File`` from the node's GRES, so each is named."""
    if gpus < 0:
        raise ConfigError(f"gpus must be >= 0, got {gpus}")
    head = "# Rendered by the node agent from the node's own GPU count (nvidia-smi -L).\n"
    if gpus == 0:
        return head
    dev = SlurmPaths(root).root / "dev"
    files = f"{dev}/nvidia0" if gpus == 1 else f"{dev}/nvidia[0-{gpus - 1}]"
    return f"{head}Name=gpu File={files}\n"


def render_task_prolog(env_file: str) -> str:
    """Slurm's ``TaskProlog``: its ``export NAME=value`` lines set the task's environment.

    sbatch and srun hand every task the submitter's environment, and a login shell on the
    master holds the master's DEEPLEARNING_* variables (``/etc/profile.d/deeplearning.sh``):
    without this, a task on a worker would be told it is node rank 0 at the master's address.
    The script runs as the job's user and reads only the node's own root-written
    ``env_file`` (the same variables dl-run's ranks get); a node without it yet exports
    nothing (a failing TaskProlog would fail the task)."""
    quoted = "'" + env_file.replace("'", "'\\''") + "'"
    return ("#!/bin/sh\n"
            "# Rendered by the node agent (bootstrap_scripts/slurm/config.py): Slurm's "
            "TaskProlog.\n"
            f"[ -r {quoted} ] || exit 0\n"
            "exec /usr/bin/sed -n 's/^\\(DEEPLEARNING_[A-Z0-9_]*\\|EFS_MOUNT\\)=\\(.*\\)$/"
            f"export \\1=\\2/p' {quoted}\n")


def render_prolog(*, python: str, package_dir: str, root: str, efs: str) -> str:
    """Slurm's ``Prolog`` (run by slurmd as root): ``bootstrap_scripts.slurm.prolog`` with a
    fixed environment. slurmd gives a prolog variables of its own (``SLURM_JOB_ID``,
    ``SLURM_JOB_USER``, the job's working directory and output paths, ...), never the job's
    environment; still nothing of what it is given reaches the program but the job id (a
    number, for the log): ``env -i`` with a system PATH (the node's own tool directories
    under its root first), the agent's own interpreter by absolute path with ``-I`` (no
    ``PYTHON*`` variable, no user site, no working directory on ``sys.path``), the package
    from the agent's own directory."""
    bins = [f"{root.rstrip('/')}/{d}" for d in ("usr/bin", "usr/sbin")] if root != "/" else []
    path = ":".join([*bins, SYSTEM_PATH])
    boot = (f"import sys; sys.path.insert(0, {package_dir!r}); "
            "from bootstrap_scripts.slurm.prolog import main; sys.exit(main(sys.argv[1:]))")
    argv = ["/usr/bin/env", "-i", f"PATH={path}", "LANG=C.UTF-8", "LC_ALL=C.UTF-8",
            python, "-I", "-c", boot, "--root", root, "--efs", efs]
    return ("#!/bin/sh\n"
            "# Rendered by the node agent (bootstrap_scripts/slurm/config.py): Slurm's Prolog, "
            "the health gate.\n"
            f"exec {' '.join(shlex.quote(a) for a in argv)} --job \"${{SLURM_JOB_ID:-}}\"\n")


def render_cgroup_conf() -> str:
    """Slurm 22.05 reads cgroup.conf even when no cgroup plugin confines jobs; ``autodetect``
    picks the host's cgroup version (v2 on AL2023)."""
    return "CgroupPlugin=autodetect\n"


def slurmd_node_conf(role: str, instance_type: str, gpus: int) -> str:
    """slurmd's ``--conf`` for a dynamic node: its features, and its GPUs as GRES."""
    parts = [f"Feature={','.join(names.features(role, instance_type))}"]
    if gpus > 0:
        parts.append(f"Gres=gpu:{gpus}")
    return " ".join(parts)

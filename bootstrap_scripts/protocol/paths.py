"""Every path of the cluster protocol: on a node (under its root) and on the shared EFS.

Nothing else in the project spells these names; it asks here. A node's files live under its
root prefix ("/" on a real node, a directory per node in the local emulator); the cluster's
state lives under the EFS mount point.

On a node (relative to its root)::

    opt/deeplearning/workers          one host per line, master first
    opt/deeplearning/hostfile         MPI hostfile: "host slots=N"
    opt/deeplearning/horovod_hosts    "host:slots" per line
    opt/deeplearning/membership.json  the membership this node applied
    opt/deeplearning/env              DEEPLEARNING_* as KEY=VALUE (systemd, runner)
    etc/profile.d/deeplearning.sh     the same variables for login shells
    etc/hosts                         managed block with the deeplearning-* aliases
    var/lib/dl-agent/state.json       the master agent's memory across restarts
    var/lib/dl-agent/<name>.lock      held (flock) by the one running <name> daemon
    var/lib/dl-agent/node-key.pem     this node's private signing key (root's, 0600)
    var/lib/dl-agent/node-keys/<instance-id>.pem  the master: each node's public key
    var/lib/dl-executor/shares/<user>.<job-id>.<rank>.<n>.status  how process n of a share
                                      ended, written by its wrapper (a restarted executor
                                      reads it)
    var/lib/dl-executor/job-credentials/<user>.<job-id>/  a running job's job role credentials
                                      (root's directory, files 0600 for the job's user)
    etc/slurm/, etc/munge/, run/munge/, run/slurm/, var/log/slurm/, var/spool/slurmd/
                                      scheduler=slurm: Slurm's and munge's files
                                      (``protocol.slurm_paths``)

On EFS (relative to the mount point)::

    cluster/membership.json           the live membership (generation N)
    cluster/generations/<N>.json      every generation ever published
    cluster/membership.log            "SEQ ADDED|REMOVED ADDRESS TIMESTAMP" lines
    cluster/nodes/<instance-id>.json  node registrations (agent heartbeat), signed by the node
    cluster/logs/<instance-id>.log    each node agent's log
    cluster/executors/<address>.json  job executor heartbeats, signed by the node
    cluster/drain/<instance-id>.json  drain request (master -> node)
    cluster/drain/<instance-id>.done  drain done (node's executor -> master), signed by the node
    cluster/prepared/<instance-id>.ok|.failed   data preparation outcome
    cluster/prepared/<instance-id>.log          data preparation output
    cluster/health/.probe-<host>-<pid>  dl-health's write/read-back probe (deleted at once)
    cluster/launch-failures.json      launches that failed, per zone and type (the master)
    cluster/wait-condition.json       the master signalled the stack's wait condition (once)
    cluster/instance-types/<type>.json  an instance type's GPUs and EFA support (health gate's
                                      cache of EC2 DescribeInstanceTypes)
    cluster/prices/<market>.<place>.<type>.json  an instance type's hourly price (the job
                                      controller's cache of the Price List / Spot history)
    cluster/controller.json           the job controller's heartbeat (master)
    cluster/slurm/state/              scheduler=slurm: slurmctld's StateSaveLocation
    jobs/<user>/<job-id>/             one directory per job (see JobPaths); ``jobs/`` is
                                      root's (0755), ``jobs/<user>/`` made by root, the user's
    managed/<user>/<job-id>/          one managed job (see ManagedPaths); its attempts are
                                      ordinary jobs ``jobs/<user>/<job-id>.<attempt>/``
    checkpoints/<user>/<name>/        training checkpoints (the example job's default); each
                                      user's directory is theirs alone (0700, made by root)
    archive/managed/<user>/<job-id>/  finished managed jobs past their retention (controller)
    archive/jobs/<user>/<job-id>/     finished jobs past their retention (controller)

A job is named by its user and its id together, its *key* ``<user>/<job-id>``: two users
may both have a job ``train``, and wherever root acts on jobs of several users (executors,
the job controller) it names them by key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.job_paths import (  # noqa: F401 (re-exported: ask here)
    JOB_ID_RE,
    SHARE_CLAIM_SUFFIX,
    SHARE_LOG_SUFFIX,
    SHARE_STARTED_SUFFIX,
    USER_NAME_RE,
    JobPaths,
    ManagedPaths,
    job_key,
    own_user,
    parse_share_file,
    split_key,
    validate_job_id,
    validate_user,
)
from bootstrap_scripts.protocol.node_paths import (  # noqa: F401 (re-exported: ask here)
    AGENT_STATE_DIR,
    AGENT_STATE_FILE,
    APPLIED_DRAIN_FILE,
    DEEPLEARNING_DIR,
    ENV_FILE,
    EXECUTOR_STATE_DIR,
    HOROVOD_HOSTS_FILE,
    HOSTS_FILE,
    MEMBERSHIP_FILE,
    MPI_HOSTFILE,
    NODE_KEY_FILE,
    NODE_KEYS_DIR,
    PROFILE_FILE,
    SHARE_STATUS_DIR,
    WORKERS_FILE,
    NodePaths,
)
from bootstrap_scripts.protocol.slurm_paths import (  # noqa: F401 (re-exported: ask here)
    SLURM_LAYOUT,
    SlurmPaths,
)

# -- on EFS, relative to the mount point ---------------------------------------------------------
CLUSTER_DIR = "cluster"
MEMBERSHIP = f"{CLUSTER_DIR}/membership.json"
GENERATIONS_DIR = f"{CLUSTER_DIR}/generations"
MEMBERSHIP_LOG = f"{CLUSTER_DIR}/membership.log"
NODES_DIR = f"{CLUSTER_DIR}/nodes"
LOGS_DIR = f"{CLUSTER_DIR}/logs"
EXECUTORS_DIR = f"{CLUSTER_DIR}/executors"
LISTENERS_DIR = f"{CLUSTER_DIR}/listeners"
DRAIN_DIR = f"{CLUSTER_DIR}/drain"
PREPARED_DIR = f"{CLUSTER_DIR}/prepared"
HEALTH_DIR = f"{CLUSTER_DIR}/health"
LAUNCH_FAILURES = f"{CLUSTER_DIR}/launch-failures.json"
WAIT_SIGNAL = f"{CLUSTER_DIR}/wait-condition.json"
INSTANCE_TYPES_DIR = f"{CLUSTER_DIR}/instance-types"
PRICES_DIR = f"{CLUSTER_DIR}/prices"
CONTROLLER_HEARTBEAT = f"{CLUSTER_DIR}/controller.json"
#: The job controller's idle stop: idle since when, workers stopped when, their size before.
IDLE_STOP = f"{CLUSTER_DIR}/idle-stop.json"
#: The job controller's circuit breaker: its marks of the last hour, signed by the master.
BREAKER = f"{CLUSTER_DIR}/breaker.json"
#: The job controller's own, signed record of each managed job (root's: no user writes it).
CONTROLLER_JOBS_DIR = f"{CLUSTER_DIR}/managed"
JOBS_DIR = "jobs"
#: Training checkpoints, one directory per job name (the example job's default).
CHECKPOINTS_DIR = "checkpoints"
#: Managed jobs (``dl-run`` without ``--unmanaged``): the request, the controller's record.
MANAGED_DIR = "managed"
ARCHIVE_DIR = "archive"
#: Root-owned (0755) parents of one directory per user (``<dir>/<user>/``, made by root and
#: handed to the user): what no other user may plant anything in. The value is the mode of
#: the user's directory: 0700 where nobody else has any business (checkpoints), 0755 where
#: every user may read (not write) what ``dl-jobs`` shows of every job: its state and logs.
PER_USER_DIRS = {CHECKPOINTS_DIR: 0o700, JOBS_DIR: 0o755, MANAGED_DIR: 0o755}

_JOB, _MANAGED = f"{JOBS_DIR}/<user>/<job-id>", f"{MANAGED_DIR}/<user>/<job-id>"
#: Every path above, in the form docs/protocol.md spells it (a test holds the two together).
LAYOUT = (
    WORKERS_FILE, MPI_HOSTFILE, HOROVOD_HOSTS_FILE, MEMBERSHIP_FILE, ENV_FILE, PROFILE_FILE,
    HOSTS_FILE, AGENT_STATE_FILE, APPLIED_DRAIN_FILE, f"{AGENT_STATE_DIR}/<name>.lock",
    NODE_KEY_FILE, f"{NODE_KEYS_DIR}/<instance-id>.pem",
    f"{SHARE_STATUS_DIR}/<user>.<job-id>.<rank>.<n>.status", MEMBERSHIP,
    f"{GENERATIONS_DIR}/<N>.json", MEMBERSHIP_LOG,
    f"{NODES_DIR}/<instance-id>.json", f"{LOGS_DIR}/<instance-id>.log",
    f"{EXECUTORS_DIR}/<address>.json", f"{LISTENERS_DIR}/<address>.<seq>.json",
    f"{DRAIN_DIR}/<instance-id>.json",
    f"{DRAIN_DIR}/<instance-id>.done", f"{PREPARED_DIR}/<instance-id>.ok",
    f"{PREPARED_DIR}/<instance-id>.failed", f"{PREPARED_DIR}/<instance-id>.log",
    f"{HEALTH_DIR}/.probe-<host>-<pid>", LAUNCH_FAILURES, WAIT_SIGNAL,
    f"{INSTANCE_TYPES_DIR}/<type>.json", f"{PRICES_DIR}/<market>.<place>.<type>.json",
    f"{CHECKPOINTS_DIR}/<user>/<name>/",
    f"{_JOB}/spec.json", f"{_JOB}/spec.json.sig", f"{_JOB}/commands.txt",
    f"{_JOB}/runner.json", f"{_JOB}/cancel", f"{_JOB}/done", f"{_JOB}/result.json",
    f"{_JOB}/staging.json", f"{_JOB}/nodes/<rank>.log", f"{_JOB}/nodes/<rank>.started",
    f"{_JOB}/nodes/<rank>.exit", f"{_JOB}/nodes/<rank>.claim", f"{_JOB}/admitted/<address>",
    f"{_JOB}/progress/<rank>.json", f"{_JOB}/flight/", f"{_JOB}/stacks/<rank>.json",
    CONTROLLER_HEARTBEAT, IDLE_STOP, BREAKER, f"{CONTROLLER_JOBS_DIR}/<user>/<job-id>.json",
    f"{_MANAGED}/request.json",
    f"{_MANAGED}/request.json.sig",
    f"{_MANAGED}/job.json", f"{_MANAGED}/cancel",
    f"{_MANAGED}/attempts/<n>.log",
    f"{_MANAGED}/attempts/<n>.membership.json",
    f"{_MANAGED}/attempts/<n>.hang.json",
    f"{ARCHIVE_DIR}/{MANAGED_DIR}/<user>/<job-id>/",
    f"{ARCHIVE_DIR}/{MANAGED_DIR}/<user>/<job-id>.controller.json",
    f"{ARCHIVE_DIR}/{JOBS_DIR}/<user>/<job-id>/",
    *SLURM_LAYOUT,
)

@dataclass(frozen=True)
class ClusterPaths:
    """The cluster's state on the shared file system, under the EFS mount point."""

    efs: Path

    def __init__(self, efs: str | os.PathLike) -> None:
        object.__setattr__(self, "efs", Path(efs))

    @property
    def cluster_dir(self) -> Path:
        return self.efs / CLUSTER_DIR

    @property
    def membership(self) -> Path:
        return self.efs / MEMBERSHIP

    @property
    def generations_dir(self) -> Path:
        return self.efs / GENERATIONS_DIR

    def generation(self, number: int) -> Path:
        return self.generations_dir / f"{number}.json"

    @property
    def membership_log(self) -> Path:
        return self.efs / MEMBERSHIP_LOG

    @property
    def nodes_dir(self) -> Path:
        return self.efs / NODES_DIR

    def registration(self, instance_id: str) -> Path:
        return self.nodes_dir / f"{instance_id}.json"

    @property
    def logs_dir(self) -> Path:
        return self.efs / LOGS_DIR

    def agent_log(self, instance_id: str) -> Path:
        return self.logs_dir / f"{instance_id}.log"

    @property
    def executors_dir(self) -> Path:
        return self.efs / EXECUTORS_DIR

    def executor_heartbeat(self, address: str) -> Path:
        return self.executors_dir / f"{address}.json"

    @property
    def listeners_dir(self) -> Path:
        """``<address>.<seq>.json`` (:class:`~bootstrap_scripts.protocol.records.NodeListeners`):
        what each node's jobs listen on; the sequence number in the name tells a reader
        which files changed from one directory listing."""
        return self.efs / LISTENERS_DIR

    def listeners(self, address: str, seq: int) -> Path:
        return self.listeners_dir / f"{address}.{seq}.json"

    @property
    def drain_dir(self) -> Path:
        return self.efs / DRAIN_DIR

    def drain_request(self, instance_id: str) -> Path:
        return self.drain_dir / f"{instance_id}.json"

    def drain_done(self, instance_id: str) -> Path:
        return self.drain_dir / f"{instance_id}.done"

    @property
    def prepared_dir(self) -> Path:
        return self.efs / PREPARED_DIR

    def prepared(self, instance_id: str, outcome: str) -> Path:
        """``outcome`` is "ok" or "failed"."""
        if outcome not in ("ok", "failed"):
            raise ValueError(f"prepared outcome must be 'ok' or 'failed', got {outcome!r}")
        return self.prepared_dir / f"{instance_id}.{outcome}"

    def prepared_log(self, instance_id: str) -> Path:
        """The data-preparation command's output on that node (appended, for humans)."""
        return self.prepared_dir / f"{instance_id}.log"

    @property
    def health_dir(self) -> Path:
        return self.efs / HEALTH_DIR

    @property
    def wait_signal(self) -> Path:
        return self.efs / WAIT_SIGNAL

    @property
    def launch_failures(self) -> Path:
        """What failed to launch, per zone and type (``protocol.launches``)."""
        return self.efs / LAUNCH_FAILURES

    def health_probe(self, tag: str) -> Path:
        """dl-health's probe file: a dot-file, so record scanners skip it."""
        return self.health_dir / f".probe-{tag}"

    @property
    def prices_dir(self) -> Path:
        return self.efs / PRICES_DIR

    def price(self, market: str, place: str, instance_type: str) -> Path:
        """The job controller's cached hourly price of ``instance_type`` bought on
        ``market`` in ``place`` (a region, or for Spot a zone)."""
        for what, value in (("market", market), ("place", place),
                            ("instance type", instance_type)):
            if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,63}", value):
                raise ProtocolError(f"not a price's {what}: {value!r}")
        return self.prices_dir / f"{market}.{place}.{instance_type}.json"

    @property
    def instance_types_dir(self) -> Path:
        return self.efs / INSTANCE_TYPES_DIR

    def instance_type(self, name: str) -> Path:
        """The health gate's cached DescribeInstanceTypes facts of one instance type."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,63}", name):
            raise ProtocolError(f"not an EC2 instance type name: {name!r}")
        return self.instance_types_dir / f"{name}.json"

    @property
    def controller_heartbeat(self) -> Path:
        return self.efs / CONTROLLER_HEARTBEAT

    @property
    def idle_stop(self) -> Path:
        """The job controller's idle-stop record (``IdleStopRecord``)."""
        return self.efs / IDLE_STOP

    @property
    def breaker(self) -> Path:
        """The circuit breaker's marks (``BreakerMarks``), signed by the master."""
        return self.efs / BREAKER

    def controller_job(self, key: str) -> Path:
        """``cluster/managed/<user>/<job-id>.json``: the controller's signed record of the
        job ``<user>/<job-id>`` (a copy of ``job.json`` no user can write)."""
        user, _, job_id = key.partition("/")
        return (self.efs / CONTROLLER_JOBS_DIR / validate_user(user)
                / f"{validate_job_id(job_id)}.json")

    def archived_controller_job(self, key: str) -> Path:
        """Where retention moves it with the job:
        ``archive/managed/<user>/<job-id>.controller.json``."""
        user, _, job_id = key.partition("/")
        return (self.archive_dir / MANAGED_DIR / validate_user(user)
                / f"{validate_job_id(job_id)}.controller.json")

    @property
    def jobs_dir(self) -> Path:
        return self.efs / JOBS_DIR

    @property
    def managed_dir(self) -> Path:
        return self.efs / MANAGED_DIR

    def user_managed_dir(self, user: str) -> Path:
        """``managed/<user>/``: one user's managed jobs (made by root, the user's)."""
        return self.managed_dir / validate_user(user)

    def managed(self, ref: str, user: str | None = None) -> ManagedPaths:
        """``managed/<user>/<job-id>/`` of a key or of a bare id (see :func:`split_key`)."""
        owner, job_id = split_key(ref, user)
        return ManagedPaths(self.managed_dir / owner / job_id)

    @property
    def checkpoints_dir(self) -> Path:
        return self.efs / CHECKPOINTS_DIR

    def user_checkpoints(self, user: str) -> Path:
        """``checkpoints/<user>/``: one user's checkpoints, writable by that user alone."""
        return self.checkpoints_dir / validate_user(user)

    @property
    def archive_dir(self) -> Path:
        """Finished jobs past their retention: ``archive/managed/`` and ``archive/jobs/``."""
        return self.efs / ARCHIVE_DIR

    def user_jobs_dir(self, user: str) -> Path:
        """``jobs/<user>/``: one user's jobs (made by root, the user's)."""
        return self.jobs_dir / validate_user(user)

    def job(self, ref: str, user: str | None = None) -> JobPaths:
        """``jobs/<user>/<job-id>/`` of a key or of a bare id (see :func:`split_key`)."""
        owner, job_id = split_key(ref, user)
        return JobPaths(self.jobs_dir / owner / job_id)

"""The node agent's settings: :class:`AgentConfig`, its command line and its exit statuses.

Standard library only, so the installer (``bootstrap_scripts.agent.install``) and the local
emulator can validate a user data's arguments without importing the agent itself (boto3,
threads, EFS). Every option is declared once, in :data:`OPTIONS`; the parser and the
installer's ``--name=value`` rendering are both built from that list, and each option's
default is the matching :class:`AgentConfig` field's, so the three cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from bootstrap_scripts.containers import allow
from bootstrap_scripts.data import checksums
from bootstrap_scripts.jobs.controller.instance_health import DEFAULT_MAX_REPLACEMENTS_PER_HOUR

#: Exit status for a definite failure already reported (systemd must not restart it).
EXIT_FAILED = 2
#: Exit status for bad arguments (systemd must not restart it either).
EXIT_USAGE = 64
#: Exit status when another ``dl-agent`` already holds this node's lock
#: (:mod:`bootstrap_scripts.node.single_instance`). It is :data:`EXIT_FAILED`'s value on purpose:
#: the unit's ``RestartPreventExitStatus`` lists that one, and restarting cannot help while
#: the other agent runs (the unit's own agent keeps running undisturbed).
EXIT_ALREADY_RUNNING = EXIT_FAILED
#: The lock file name (``var/lib/dl-agent/dl-agent.lock``).
LOCK_NAME = "dl-agent"
#: The cluster's scheduler (the stack's ``scheduler`` setting): the product's own job queue,
#: or Slurm's daemons (slurmctld on the master, slurmd on every node that trains).
NATIVE_SCHEDULER, SLURM_SCHEDULER = "native", "slurm"
SCHEDULERS = (NATIVE_SCHEDULER, SLURM_SCHEDULER)


@dataclass
class AgentConfig:
    role: str
    cluster_id: str
    stack_name: str
    region: str
    master_queue_url: str = ""
    efs_id: str = ""
    mount_point: str = "/efs"
    wait_handle: str = ""
    setup_timeout: float = 3300.0
    root: str = "/"
    no_mount: bool = False
    poll_wait: int = 20
    watch_interval: float = 0.25
    heartbeat_interval: float = 5.0
    registration_wait: float = 60.0
    mount_timeout: float = 900.0
    resync_interval: float = 300.0
    nvidia_smi: str = "nvidia-smi"
    data_prep: str = ""
    data_prep_timeout: float = 3300.0
    base_workers: int = -1
    drain_timeout: float = 240.0
    max_replacements_per_hour: int = DEFAULT_MAX_REPLACEMENTS_PER_HOUR
    idle_stop_seconds: float = 0.0
    idle_stop_master_seconds: float = 0.0
    release_function: str = ""
    membership_key: str = ""
    job_role_arn: str = ""
    checkpoint_url: str = ""
    launch_hook: str = ""
    warm_poll_interval: float = 5.0
    warm_ready_queue_url: str = ""
    worker_role_id: str = ""
    node_keys_queue_url: str = ""
    data_checksums: str = checksums.WARN
    #: the stack's ``allowedImages``: comma-separated registries / repository prefixes
    allowed_images: str = ""
    scheduler: str = NATIVE_SCHEDULER
    munge_key_secret: str = ""

    def __post_init__(self) -> None:
        if self.role not in ("master", "worker"):
            raise ValueError(f"--role must be master or worker, got {self.role!r}")
        if not self.cluster_id:
            raise ValueError("--cluster-id must not be empty")
        allow.check_entries(allow.parse_entries(self.allowed_images))
        if self.role == "master" and not self.master_queue_url:
            raise ValueError("--master-queue-url is required on the master")
        if not 0 <= self.poll_wait <= 20:
            raise ValueError(f"--poll-wait must be 0..20 (SQS limit), got {self.poll_wait}")
        if self.setup_timeout <= 0:
            raise ValueError(f"--setup-timeout must be positive, got {self.setup_timeout}")
        if self.drain_timeout <= 0:
            raise ValueError(f"--drain-timeout must be positive, got {self.drain_timeout}")
        if self.data_prep_timeout <= 0:
            raise ValueError(
                f"--data-prep-timeout must be positive, got {self.data_prep_timeout}")
        if self.max_replacements_per_hour < 0:
            raise ValueError(f"--max-replacements-per-hour must be >= 0, got "
                             f"{self.max_replacements_per_hour}")
        if self.idle_stop_seconds < 0:
            raise ValueError(f"--idle-stop-seconds must be >= 0, got {self.idle_stop_seconds}")
        if self.idle_stop_master_seconds < 0:
            raise ValueError(f"--idle-stop-master-seconds must be >= 0, got "
                             f"{self.idle_stop_master_seconds}")
        if self.warm_poll_interval <= 0:
            raise ValueError(
                f"--warm-poll-interval must be positive, got {self.warm_poll_interval}")
        if self.launch_hook and not self.warm_ready_queue_url:
            raise ValueError("--launch-hook needs --warm-ready-queue-url (where a worker says "
                             "it is ready)")
        if self.role == "master" and self.launch_hook and not self.worker_role_id:
            raise ValueError("--launch-hook on the master needs --worker-role-id (whose "
                             "ready messages it believes)")
        if self.role == "master" and self.node_keys_queue_url and not self.worker_role_id:
            raise ValueError("--node-keys-queue-url on the master needs --worker-role-id "
                             "(whose keys it learns)")
        if self.scheduler == SLURM_SCHEDULER and not self.munge_key_secret:
            raise ValueError("--scheduler slurm needs --munge-key-secret (the cluster's munge "
                             "key in Secrets Manager)")
        if self.base_workers < -1:
            raise ValueError(f"--base-workers must be >= 0 (or -1: all), got {self.base_workers}")


@dataclass(frozen=True)
class Option:
    """One command-line option; ``--name`` maps to the AgentConfig field ``name``."""

    flag: str
    help: str = ""
    choices: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def field(self) -> dataclasses.Field:
        return _FIELDS[self.dest]

    @property
    def required(self) -> bool:
        return self.field.default is dataclasses.MISSING

    @property
    def is_switch(self) -> bool:
        """A flag without a value (``--no-mount``)."""
        return self.field.type in (bool, "bool")


_FIELDS = {f.name: f for f in dataclasses.fields(AgentConfig)}
_TYPES = {"str": str, "int": int, "float": float}

#: Every option of ``dl-agent``, in the order the installer writes them.
OPTIONS: tuple[Option, ...] = (
    Option("--role", choices=("master", "worker")),
    Option("--cluster-id"),
    Option("--stack-name"),
    Option("--region"),
    Option("--master-queue-url"),
    Option("--efs-id"),
    Option("--mount-point"),
    Option("--wait-handle", "presigned URL; '' = nothing to signal"),
    Option("--setup-timeout", "seconds the master waits for both groups (default 3300)"),
    Option("--root", "prefix for node files (emulator/tests)"),
    Option("--no-mount", "treat --mount-point as a plain shared directory (emulator/tests)"),
    Option("--poll-wait", "SQS long-poll seconds (0..20)"),
    Option("--watch-interval", "seconds between checks of the EFS membership (workers)"),
    Option("--heartbeat-interval"),
    Option("--registration-wait", "seconds the master waits for nodes to register before "
           "forming"),
    Option("--mount-timeout"),
    Option("--resync-interval", "master re-reads the groups this often even without messages"),
    Option("--nvidia-smi"),
    Option("--data-prep", "shell command every node runs before it joins ('' = none)"),
    Option("--data-prep-timeout", "seconds the data-preparation command may run "
           "(default 3300)"),
    Option("--base-workers", "master: workers protected from scale-in (-1 = all at "
           "formation)"),
    Option("--drain-timeout", "master: seconds a drained node gets to stop its job shares "
           "(below the lifecycle hook's 300 s heartbeat)"),
    Option("--max-replacements-per-hour", "master: the job controller's circuit breaker "
           "(instances it may mark Unhealthy in any hour)"),
    Option("--idle-stop-seconds", "master: the job controller stops the workers after this "
           "many seconds with nothing to run (the stack's idleStopMinutes x 60; 0 = never)"),
    Option("--idle-stop-master-seconds", "master: then the master's own group after this "
           "many seconds more (idleStopMasterMinutes x 60; 0 = never)"),
    Option("--release-function", "master: the capacity adjuster's function, which releases "
           "the idle master's group ('' = the master never stops)"),
    Option("--membership-key", "KMS key that signs the membership (the master signs, "
           "workers apply only what it signed; '' = unsigned)"),
    Option("--job-role-arn", "the stack's job role, for the executor: each job gets its own "
           "temporary credentials of it ('' = none)"),
    Option("--checkpoint-url", "master: the cluster's checkpoint prefix in S3 "
           "(s3://BUCKET/checkpoints/<cluster-id>/); managed jobs' checkpoints are mirrored "
           "under it ('' = none)"),
    Option("--launch-hook", "the worker group's launch lifecycle hook (a warm pool's). A "
           "worker holds while its target lifecycle state is Warmed:*, says it is ready on "
           "--warm-ready-queue-url and joins once InService; the master completes the "
           "action of the instance that said so ('' = no hook: join at once)"),
    Option("--warm-ready-queue-url", "the warm-ready queue: workers send on it, the master "
           "receives ('' = none)"),
    Option("--worker-role-id", "master: the workers' role's unique ID; only a ready "
           "message whose SQS SenderId is a session of it completes a launch ('' = none)"),
    Option("--warm-poll-interval", "seconds between reads of the target lifecycle state "
           "while held in the warm pool (default 5)"),
    Option("--node-keys-queue-url", "the node-keys queue: a worker sends its public key on "
           "it, the master learns it from the sender SQS names and then ignores node "
           "records not signed by their node ('' = none: nothing checked)"),
    Option("--data-checksums", "the cluster's default of dl-run --data-checksums (the "
           "stack's dataChecksums): the installer writes it to etc/dl-cluster/data-checksums "
           "for dl-run (default warn)", choices=checksums.MODES),
    Option("--allowed-images", "the stack's allowedImages: comma-separated registries or "
           "repository prefixes dl-run --image accepts; the installer writes them to "
           "etc/dl-cluster/allowed-images ('' = none: images refused)"),
    Option("--scheduler", "the cluster's scheduler (the stack's scheduler setting): native, "
           "the product's own queue, or slurm: slurmctld on the master, slurmd on every node "
           "(default native)", choices=SCHEDULERS),
    Option("--munge-key-secret", "with --scheduler slurm: the ARN of the Secrets Manager "
           "secret holding the cluster's munge key, read with the node's role ('' = none)"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dl-agent", description="The node agent: learns the cluster's membership and "
        "writes the files and DEEPLEARNING_* variables that training jobs use.")
    for opt in OPTIONS:
        kwargs: dict = {"help": opt.help or None}
        if opt.is_switch:
            kwargs["action"] = "store_true"
        elif opt.required:
            kwargs["required"] = True
        else:
            kwargs["default"] = opt.field.default
        if not opt.is_switch:
            kwargs["type"] = _TYPES[str(opt.field.type)]
        if opt.choices:
            kwargs["choices"] = list(opt.choices)
        p.add_argument(opt.flag, **kwargs)
    return p


def config_from_args(argv: Sequence[str] | None = None) -> AgentConfig:
    ns = build_parser().parse_args(argv)
    return AgentConfig(**vars(ns))


def canonical_args(ns: argparse.Namespace | AgentConfig) -> list[str]:
    """Every option as ``--name=value`` (empty values survive: ``--wait-handle=``); a switch
    only when set. Parsing the result gives back the same settings."""
    args: list[str] = []
    for opt in OPTIONS:
        value = getattr(ns, opt.dest)
        if opt.is_switch:
            if value:
                args.append(opt.flag)
        else:
            args.append(f"{opt.flag}={value}")
    return args

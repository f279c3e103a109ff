"""ClusterSettings: the one description of DLClusterStack's settings (``-c key=value``).

Each field is a :class:`~constructs_lib.setting.Setting`: context key, default, bounds, check
and the README's text. ``DeepLearningCluster``'s props take their defaults from here (or from
the constant of the construct that owns the default, imported below), app.py parses and checks
the context with it, and docs/settings.md table is generated from it
(``python -m stacks.settings_doc``).
"""

from __future__ import annotations

from dataclasses import dataclass

from bootstrap_scripts.agent.settings import NATIVE_SCHEDULER, SCHEDULERS
from bootstrap_scripts.data import checksums
from bootstrap_scripts.jobs.controller.instance_health import (
    DEFAULT_MAX_REPLACEMENTS_PER_HOUR,
)
from constructs_lib import validation
from constructs_lib.allowed_images import check_allowed_images
from constructs_lib.capacity_adjuster import (
    DEFAULT_LAUNCH_RETRY_SECONDS,
    MAX_LAUNCH_RETRY_SECONDS,
)
from constructs_lib.cluster_budget import check_usd_per_day
from constructs_lib.idle_stop import (
    DEFAULT_IDLE_STOP_MASTER_MINUTES,
    DEFAULT_IDLE_STOP_MINUTES,
    MAX_IDLE_STOP_MINUTES,
)
from constructs_lib.images import DEFAULT_IMAGE_TYPE, IMAGE_FAMILIES, pytorch_version
from constructs_lib.launch import (
    DEFAULT_CAPACITY_BLOCK_LEAD_MINUTES,
    DEFAULT_MAX_ZONE_MOVES,
    MAX_CAPACITY_BLOCK_LEAD_MINUTES,
    MIN_CAPACITY_BLOCK_LEAD_MINUTES,
)
from constructs_lib.lustre_storage import check_shared_storage
from constructs_lib.network import DEFAULT_NAT_GATEWAYS, DEFAULT_VPC_CIDR
from constructs_lib.node_group import DEFAULT_ROOT_VOLUME_GIB
from constructs_lib.observability import (
    DEFAULT_EFS_IO_ALARM_GIB_PER_HOUR,
    DEFAULT_LOG_RETENTION_DAYS,
    MAX_EFS_IO_ALARM_GIB_PER_HOUR,
    RETENTION_DAYS,
    check_email,
    retention_setting,
)
from constructs_lib.operator_document import check_cluster_users
from constructs_lib.resume_sources import parse_source_urls
from constructs_lib.setting import default_of, setting
from constructs_lib.shared_storage import DEFAULT_MOUNT_POINT
from constructs_lib.user_data import DEFAULT_NODE_BOOT_SECONDS, MIN_NODE_BOOT_SECONDS

#: Most workers a stack setting accepts (workerCount, spotWorkers, maxWorkers): far above any
#: GPU quota an account starts with, low enough that a typo (100000) fails at synth instead
#: of after an hour of launch errors. The construct itself takes any count.
MAX_WORKERS = 1000
#: Most zone moves: more than the zones of any region.
MAX_ZONE_MOVES = 10
#: Most NAT gateways: one per zone of a region with the most (us-east-1 has six); the VPC's
#: own zone count is the real limit (``stacks/settings.py``).
MAX_NAT_GATEWAYS = 6
#: Longest node boot budget (50 minutes); the setup wait grows with it (``user_data.setup_wait``).
MAX_NODE_BOOT_SECONDS = 3000
#: Instance type of the master and of the workers.
DEFAULT_INSTANCE_TYPE = "g5.xlarge"

_TYPE = "an EC2 instance type, `family.size`"
_TYPES = "instance types, comma-separated, at most 20"


def _image_type(name: str, value: object) -> str:
    return validation.one_of(name, str(value), tuple(IMAGE_FAMILIES))


def _text(_name: str, value: object) -> str:
    return str(value)


def _nat_gateways(name: str, value: object) -> int:
    return validation.count(name, value, minimum=1, maximum=MAX_NAT_GATEWAYS)


def _scheduler(name: str, value: object) -> str:
    return validation.one_of(name, str(value), SCHEDULERS)


@dataclass(frozen=True)
class ClusterSettings:
    """DLClusterStack's settings; an unset key keeps the default here (docs/settings.md)."""

    worker_count: int = setting(
        "workerCount", 2, "worker nodes (the master trains too, so the cluster has "
        "workerCount + 1 nodes)", validation.count, minimum=1, maximum=MAX_WORKERS)
    worker_instance_type: str | None = setting(
        "workerInstanceType", None, "instance type of the workers", validation.instance_type,
        default_doc=f"`{DEFAULT_INSTANCE_TYPE}`", accepts=_TYPE)
    master_instance_type: str | None = setting(
        "masterInstanceType", None, "instance type of the master", validation.instance_type,
        default_doc=f"`{DEFAULT_INSTANCE_TYPE}`", accepts=_TYPE)
    image_type: str = setting(
        "imageType", DEFAULT_IMAGE_TYPE,
        "the PyTorch Deep Learning AMI, resolved at deploy time from its public SSM "
        "parameter (no AMI table to go stale). Amazon Linux 2023 installs amazon-efs-utils at "
        "boot, so EFS mounts with TLS; the Ubuntu DLAMI has no EFS client and cannot mount the "
        "stack's TLS-only file system, so `ubuntu` is refused at synth unless `amiId` (an image "
        "with amazon-efs-utils) or `efsFileSystemId` is given ([docs/node-agent.md]"
        "(docs/node-agent.md), \"Mounting EFS\")", _image_type,
        accepts=" or ".join(f"`{k}`" for k in IMAGE_FAMILIES))
    pytorch_version: str | None = setting(
        "pytorchVersion", None,
        "the PyTorch line of the DLAMI, as in its SSM parameter name (`…/oss-nvidia-driver-"
        "gpu-pytorch-<version>-<os>/latest/ami-id`); defaults are the newest lines AWS's "
        "release notes document. A line without a DLAMI for `imageType` is refused at synth "
        "with the lines there are (`pytorch_lines` in constructs_lib/images.py). `make synth` "
        "prints the parameter", pytorch_version,
        default_doc=", ".join(f"`{f.default_pytorch}` ({k})" for k, f in IMAGE_FAMILIES.items()),
        accepts="`major.minor`")
    ami_id: str | None = setting(
        "amiId", None, "a custom AMI id instead of the public DLAMI", validation.ami_id,
        accepts="`ami-` + hex")
    ssh_cidr: str | None = setting(
        "sshCidr", None, "unset: no SSH ingress at all, use SSM Session Manager. Set: port 22 "
        "from that CIDR to the master only, and the master moves to a public subnet",
        validation.ssh_cidr, accepts="an IPv4 CIDR no wider than /16 (wider with "
        "`sshAllowWideCidr`); never `0.0.0.0/0`")
    ssh_allow_wide_cidr: bool = setting(
        "sshAllowWideCidr", False, "`true`: accept an `sshCidr` wider than /16 (you mean to "
        "open SSH to that many addresses)", validation.flag, accepts="`true` or `false`")
    key_name: str | None = setting(
        "keyName", None, "EC2 key pair for SSH", _text, accepts="a key pair name")
    efs_file_system_id: str | None = setting(
        "efsFileSystemId", None, "use this existing EFS instead of creating one; it lives in "
        "an existing VPC, so it needs `vpcId` (the file system's VPC) and its subnets",
        validation.file_system_id, accepts="`fs-` + hex")
    vpc_id: str | None = setting(
        "vpcId", None, "run in this existing VPC instead of a new one (no lookup: synth makes "
        "no AWS call); needs `vpcPrivateSubnetIds` and `availabilityZones`, not `vpcCidr`",
        validation.vpc_id, accepts="`vpc-` + hex")
    vpc_private_subnet_ids: tuple[str, ...] | None = setting(
        "vpcPrivateSubnetIds", None, "with `vpcId`: the nodes' private subnets (with a NAT "
        "route or endpoints), one per zone of `availabilityZones`, in the same order",
        validation.subnet_ids, accepts="subnet ids, comma-separated")
    vpc_public_subnet_ids: tuple[str, ...] | None = setting(
        "vpcPublicSubnetIds", None, "with `vpcId` and `sshCidr`: the public subnets for the "
        "master, one per zone of `availabilityZones`", validation.subnet_ids,
        accepts="subnet ids, comma-separated")
    efs_mount_point: str = setting(
        "efsMountPoint", DEFAULT_MOUNT_POINT, "mount point on every node",
        validation.mount_point, accepts="an absolute path outside the system directories "
        "(`/etc`, `/usr`, `/var/lib`, …)")
    nat_gateways: int = setting(
        "natGateways", DEFAULT_NAT_GATEWAYS, "NAT gateways of the new VPC, in the zones' order "
        "(the first in the nodes' first zone). The nodes' AWS calls other than S3's (SSM, "
        "CloudWatch Logs, SQS, KMS, STS, EC2, Auto Scaling, ECR, Secrets Manager) and package "
        "installs go through one; each costs $0.045 an hour ($33 a month) and $0.045 per GB "
        "processed (us-east-1). With one, its zone is the cluster's failure domain for AWS "
        "calls, and a cluster moved to another zone for capacity reaches AWS through it, "
        "billed between zones; one per zone (`2` with two zones) keeps each zone's nodes on "
        "their own ([docs/capacity.md](docs/capacity.md), \"Zones\")", _nat_gateways,
        accepts=f"1 to the VPC's zones (2, or as many as `availabilityZones` names; at most "
        f"{MAX_NAT_GATEWAYS})")
    vpc_cidr: str = setting(
        "vpcCidr", DEFAULT_VPC_CIDR, "CIDR of the new VPC (the emulator uses "
        "`127.20.0.0/16`)", validation.vpc_cidr, accepts="an IPv4 CIDR, /16 to /24")
    root_volume_gib: int = setting(
        "rootVolumeGiB", DEFAULT_ROOT_VOLUME_GIB, "encrypted gp3 root volume size (GiB)",
        validation.root_volume,
        accepts=f"{validation.MIN_ROOT_VOLUME_GIB} to {validation.MAX_ROOT_VOLUME_GIB}")
    placement_group: bool | None = setting(
        "placementGroup", None, "all nodes in one zone, in a cluster placement group (one per "
        "zone the cluster may move to when a zone has no capacity, see \"When capacity is "
        "short\"): all-reduce traffic stays in the zone. `false`: the groups span every zone "
        "and Auto Scaling spreads the nodes, whose traffic between zones is billed $0.01/GB "
        "each way, $0.02 per GB crossing: a 1B-parameter fp16 model's gradients (2 GB) "
        "crossing once per step cost $0.04 a step, $14.40 an hour at a step every 10 s, more "
        "than the default three g5.xlarge nodes "
        "([docs/capacity.md](docs/capacity.md), \"Zones\"). Not for burstable (T), Mac or "
        "M7i-flex types (refused at synth)", validation.flag,
        default_doc="`true`; `false` with `capacityReservationId`, "
        "`capacityReservationGroupArn` or `capacityBlockId` (one zone already; a new "
        "placement group holds none of the reserved capacity)", accepts="`true` or `false`")
    efa: bool = setting(
        "efa", False, "`true`: an EFA interface on every EFA network card of the nodes' "
        "instance type (32 on p5.48xlarge, 4 on p4d.24xlarge; [docs/node-agent.md]"
        "(docs/node-agent.md), \"EFA\"), nodes in one zone; the type must support EFA, and "
        "not with `sshCidr` (a public address needs a single interface)", validation.flag,
        accepts="`true` or `false`")
    max_workers: int | None = setting(
        "maxWorkers", None, "the worker group's maximum: how far `dl-scale --workers` can "
        "grow it", validation.count, default_doc="workerCount + spotWorkers", minimum=1,
        maximum=MAX_WORKERS)
    spot_workers: int = setting(
        "spotWorkers", 0, "extra Spot workers above the on-demand base (mixed instances "
        "policy, capacity rebalancing; interruptions drain)", validation.count, minimum=0,
        maximum=MAX_WORKERS)
    warm_pool_size: int = setting(
        "warmPoolSize", 0, "workers kept pre-initialized and stopped in an Auto Scaling warm "
        "pool: a replacement (or `dl-scale` up) starts one in seconds instead of booting a new "
        "node for minutes; the pool's stopped instances cost their EBS volumes. Not with "
        "`spotWorkers` or a `workerInstanceTypes` list (AWS refuses a warm pool with Spot or a "
        "mixed instances policy) ([docs/node-agent.md](docs/node-agent.md), \"Warm pool\")",
        validation.count, minimum=0, maximum=MAX_WORKERS)
    data_prep_script: str | None = setting(
        "dataPrepScript", None, "command every node runs before it joins (success marker on "
        "EFS; a failing node never joins)", validation.one_line, raw=True,
        accepts="one line")
    worker_instance_types: tuple[str, ...] | None = setting(
        "workerInstanceTypes", None, "ordered fallback list instead of `workerInstanceType`, "
        "e.g. `p5.48xlarge,p4d.24xlarge`: the first type with capacity launches (setting both "
        "keys is an error)", validation.instance_types, accepts=_TYPES)
    master_instance_types: tuple[str, ...] | None = setting(
        "masterInstanceTypes", None, "the same for the master (instead of "
        "`masterInstanceType`)", validation.instance_types, accepts=_TYPES)
    availability_zones: tuple[str, ...] | None = setting(
        "availabilityZones", None, "zones of the new VPC, in the nodes' order of preference (a "
        "single-zone cluster starts in the first and moves in this order)",
        validation.availability_zones, default_doc="the region's first two",
        accepts="zone names, comma-separated")
    max_zone_moves: int = setting(
        "maxZoneMoves", DEFAULT_MAX_ZONE_MOVES, "zone moves of a single-zone cluster "
        "(placement group) when launches fail for capacity, before it comes up smaller",
        validation.count, minimum=0, maximum=MAX_ZONE_MOVES)
    launch_retry_seconds: int = setting(
        "launchRetrySeconds", DEFAULT_LAUNCH_RETRY_SECONDS, "seconds from a group's creation "
        "during which a launch that failed for capacity or throttling is left to Auto "
        "Scaling's own retries before the capacity adjuster lowers the count or moves zones "
        "(configuration errors such as a bad AMI or a quota act at once)",
        validation.count, minimum=0, maximum=MAX_LAUNCH_RETRY_SECONDS - 1)
    node_boot_seconds: int = setting(
        "nodeBootSeconds", DEFAULT_NODE_BOOT_SECONDS, "the node boot budget: seconds a node may "
        "take from its launch to its registration (a DLAMI boots in minutes, a p5 longer); "
        "the master waits this long for the launched nodes before it forms the cluster "
        "without the missing ones, and ends the wait as soon as all registered; the stack's "
        "setup wait grows with it and with `maxZoneMoves` (\"The setup wait\" in "
        "docs/capacity.md)",
        validation.count, minimum=MIN_NODE_BOOT_SECONDS, maximum=MAX_NODE_BOOT_SECONDS)
    capacity_reservation_id: str | None = setting(
        "capacityReservationId", None, "launch every node into this On-Demand Capacity "
        "Reservation; needs `availabilityZones`, the reservation's zone first",
        validation.capacity_reservation_id, accepts="`cr-` + 17 hex digits")
    capacity_reservation_group_arn: str | None = setting(
        "capacityReservationGroupArn", None, "the same with a Capacity Reservation group",
        validation.resource_group_arn, accepts="`arn:aws:resource-groups:…:group/…`")
    max_replacements_per_hour: int = setting(
        "maxReplacementsPerHour", DEFAULT_MAX_REPLACEMENTS_PER_HOUR, "circuit breaker of the "
        "job controller: instances it may mark Unhealthy (Auto Scaling replaces them) in any "
        "hour; past it a node fault is recorded in the job's record and nothing is replaced "
        "([docs/security.md](docs/security.md))", validation.count, minimum=0,
        maximum=MAX_WORKERS)
    capacity_block_id: str | None = setting(
        "capacityBlockId", None, "launch every node into this Capacity Block for ML; needs "
        "`availabilityZones`, the block's zone first", validation.capacity_reservation_id,
        accepts="`cr-` + 17 hex digits")
    capacity_block_lead_minutes: int = setting(
        "capacityBlockLeadMinutes", DEFAULT_CAPACITY_BLOCK_LEAD_MINUTES, "with "
        "`capacityBlockId`: the workers leave this many minutes before the block's end "
        "time (each drained: its jobs' ranks get SIGTERM and save), the master 10 minutes "
        "later; EC2 begins terminating a block's instances 30 minutes before its end. The "
        "deploy reads the end time and fails if the block is missing, not a Capacity Block, "
        "or ends too soon (\"Capacity Blocks\" in [docs/capacity.md](docs/capacity.md))",
        validation.count, minimum=MIN_CAPACITY_BLOCK_LEAD_MINUTES,
        maximum=MAX_CAPACITY_BLOCK_LEAD_MINUTES)
    data_bucket: str | None = setting(
        "dataBucket", None, "an existing S3 bucket with the training data: the nodes may list "
        "and read it (`dataPrefix` of it) and nothing more, and `dl-run --data s3://…` stages "
        "it to each node's local disk (\"Data in S3\")", validation.bucket_name,
        accepts="a bucket name")
    data_prefix: str = setting(
        "dataPrefix", "", "with `dataBucket`: the key prefix the nodes may read (a trailing "
        "`/` is added)", validation.key_prefix, default_doc="the whole bucket",
        accepts="a key prefix such as `datasets/imagenet/`")
    data_checksums: str = setting(
        "dataChecksums", checksums.WARN, "the cluster's default of `dl-run --data-checksums` "
        "(every node has it; `dlc submit --data-checksums` and dl-run's own flag still "
        "choose per job): `required` fails a job's staging, before the job starts, on the "
        "first object whose bytes botocore cannot check against S3's checksum; `warn` stages "
        "those and counts them (\"Data in S3\")", validation.checksum_mode,
        accepts=" or ".join(f"`{m}`" for m in checksums.MODES))
    shared_storage: str = setting(
        "sharedStorage", "efs", "`fsx-lustre`: an FSx for Lustre file system too (PERSISTENT_2, "
        "1,200 GiB at 250 MB/s/TiB, KMS-encrypted), mounted at `/fsx` on every node, "
        "`/fsx/data` linked to `dataBucket`/`dataPrefix` (import only); EFS still holds the "
        "cluster's own files (\"FSx for Lustre\" under \"Data in S3\")", check_shared_storage,
        accepts="`efs` or `fsx-lustre`")
    resume_from: tuple[str, ...] = setting(
        "resumeFrom", (), "old clusters' checkpoints this cluster's jobs may read, for "
        "`dlc submit --resume-from` after `dlc down` (the old stack's `CheckpointUrl` output, "
        "`s3://<bucket>/checkpoints/<old cluster id>/`): each user's jobs read only that "
        "user's part, and decrypt with the bucket's key only through S3 (\"Data in S3\")",
        parse_source_urls, raw=True, default_doc="none",
        accepts="checkpoint URLs, comma-separated, at most 10")
    budget_per_day: float | None = setting(
        "budgetPerDay", None, "an AWS Budgets cost budget of this cluster per day, in USD: "
        "the costs tagged `dl-cluster:id=<cluster>` (activate that cost allocation tag in "
        "Billing first), notifying a KMS-encrypted SNS topic (output `AlarmTopicArn`) at "
        "80 % and 100 % of it; an alarm, not a brake (jobs stop at their own `--max-cost`)",
        check_usd_per_day, default_doc="off", accepts="USD, e.g. `250`")
    log_retention_days: int = setting(
        "logRetentionDays", DEFAULT_LOG_RETENTION_DAYS, "days the cluster's log group "
        "(`/deeplearning/<cluster id>`, every node's agent, executor, controller, boot and job "
        "logs) keeps events (\"Observability\")", retention_setting,
        accepts=", ".join(str(d) for d in sorted(RETENTION_DAYS)))
    alarm_email: str | None = setting(
        "alarmEmail", None, "subscribe this address to the cluster's alarm topic (node "
        "unhealthy, nodes missing, a job restarting repeatedly, GPUs idle while a job runs, "
        "EFS I/O); it must confirm the subscription", check_email,
        accepts="an e-mail address")
    efs_io_alarm_gib_per_hour: int = setting(
        "efsIoAlarmGiBPerHour", DEFAULT_EFS_IO_ALARM_GIB_PER_HOUR, "the EFS I/O alarm: GiB of "
        "the shared file system's metered I/O (`MeteredIOBytes`: a byte written counts one, "
        "a byte read a third) within an hour that raise an alarm on the cluster's alarm "
        "topic. Elastic throughput bills $0.06 per GB written and $0.03 per GB read "
        "(us-east-1), so a metered GiB costs $0.064-0.097 and the default, 50, about what the "
        "default cluster's three g5.xlarge cost an hour ($3.2-4.8); an existing "
        "`efsFileSystemId` counts every client's I/O (\"EFS I/O\" in docs/cost.md); `0`: no "
        "alarm", validation.count, minimum=0, maximum=MAX_EFS_IO_ALARM_GIB_PER_HOUR)

    idle_stop_minutes: int = setting(
        "idleStopMinutes", DEFAULT_IDLE_STOP_MINUTES, "idle stop: after this many minutes "
        "with no job running or queued, the master's job controller scales the workers to "
        "zero (each drained like a scale-in; the master stays), and the next `dlc submit` "
        "scales them back (\"Idle stop\"); `0`: never", validation.count, minimum=0,
        maximum=MAX_IDLE_STOP_MINUTES)

    idle_stop_master_minutes: int = setting(
        "idleStopMasterMinutes", DEFAULT_IDLE_STOP_MASTER_MINUTES, "idle stop of the master: "
        "after the workers were stopped and this many more minutes with no job, no job share "
        "and no session on the master, its own group goes to zero too (the capacity "
        "adjuster lifts its scale-in protection); `dlc submit` and `dlc up` start it again. "
        "Counts only with `idleStopMinutes` above 0 (\"Idle stop\"); `0`: the master never "
        "stops", validation.count, minimum=0, maximum=MAX_IDLE_STOP_MINUTES)

    cluster_users: tuple[str, ...] = setting(
        "clusterUsers", (), "the Linux users jobs run as (every node must have them): one "
        "SSM Command document each, `dl-op.<cluster id>.<user>`, that submits jobs as that "
        "user and cancels only theirs; the operator policy runs only the document named by "
        "its caller's `dl-user` principal tag. Unset: operators run no command on the nodes, "
        "only `AdminSessionPolicyArn` does (as any user) ([docs/security.md]"
        "(docs/security.md), \"Operators and cluster users\")", check_cluster_users,
        raw=True, default_doc="none", accepts="Linux user names, comma-separated, at most 100")

    allowed_images: tuple[str, ...] = setting(
        "allowedImages", (), "the container image repositories jobs may run from "
        "(`dl-run --image`): registries or repository prefixes, comma-separated, such as "
        "`123456789012.dkr.ecr.us-east-1.amazonaws.com/team`; any other is refused at submit; "
        "the node roles may pull from the ECR repositories listed and no other "
        "([docs/containers.md](docs/containers.md))", check_allowed_images, raw=True,
        default_doc="none: images refused", accepts="registries or repository prefixes, "
        "comma-separated")

    scheduler: str = setting(
        "scheduler", NATIVE_SCHEDULER, "the cluster's scheduler: `native`, the product's own "
        "job queue, or `slurm`: slurmctld on the master, slurmd on every node, and one munge "
        "key per cluster made at deploy in Secrets Manager, encrypted with a key of the "
        "cluster, readable by the node roles only ([docs/slurm-stack.md](docs/slurm-stack.md))",
        _scheduler, accepts=" or ".join(f"`{k}`" for k in SCHEDULERS))


#: The construct defaults that come from this description (``DeepLearningCluster``'s props).
DEFAULT_WORKER_COUNT: int = default_of(ClusterSettings, "worker_count")
DEFAULT_SPOT_WORKERS: int = default_of(ClusterSettings, "spot_workers")
DEFAULT_DATA_CHECKSUMS: str = default_of(ClusterSettings, "data_checksums")
DEFAULT_SCHEDULER: str = default_of(ClusterSettings, "scheduler")

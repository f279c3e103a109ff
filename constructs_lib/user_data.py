"""The node bootstrap script (user data): short, readable, and calling tested code.

Everything interesting happens in ``bootstrap_scripts`` (installed from an S3 asset); this
script only fetches it and runs ``bootstrap_scripts.agent.install`` with the node's
settings. The local emulator reads the arguments back from the launch template, so what is
rendered here is exactly what the emulated nodes run.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Aws
from aws_cdk import aws_ec2 as ec2

from bootstrap_scripts.agent import cloudwatch_config
from bootstrap_scripts.agent.settings import NATIVE_SCHEDULER
from bootstrap_scripts.data import checksums
from constructs_lib import validation

INSTALL_MODULE = "bootstrap_scripts.agent.install"
#: Builds munge and Slurm from their pinned sources (an image without their packages).
SLURM_BUILD_MODULE = "bootstrap_scripts.agent.slurm_build"
NODE_LIB_DIR = "/opt/deeplearning/lib"
BOOTSTRAP_LOG = "/" + cloudwatch_config.BOOTSTRAP_LOG
CLOUDWATCH_AGENT_CTL = cloudwatch_config.CTL_PATH
#: py-spy, which the job controller runs as root on every node of a hung job to dump its
#: ranks' Python stacks (docs/managed-jobs.md, "Hangs and stragglers"); the pin of requirements.txt.
PY_SPY_REQUIREMENT = "py-spy==0.4.2"
#: TensorBoard: rank 0 of the example writes its scalars with it (bootstrap_scripts/
#: tensorboard_log.py, on whichever node rank 0 lands), ``dl-jobs tensorboard`` serves them
#: on the master; the pin of requirements.txt. Best effort: a job trains without it.
TENSORBOARD_REQUIREMENT = "tensorboard==2.21.0"
#: cryptography: the node agents check the master's signatures (ECDSA P-256, the membership
#: key's public half) and the nodes' own record signatures locally instead of one KMS call per
#: check; the pin of requirements.txt. Required: a node that cannot check signatures cannot
#: join, so a failed install fails the bootstrap (and the master's wait condition says so).
CRYPTOGRAPHY_REQUIREMENT = "cryptography==50.0.2"
#: Seconds the node agent keeps retrying the EFS mount before it gives up (and the master
#: signals FAILURE with the reason). The node groups start only after every mount target is
#: available, so what is left to wait out is the mount target's DNS name and the instance
#: role reaching EFS; errors that retrying cannot fix end the wait at once
#: (docs/node-agent.md, "Mounting EFS").
MOUNT_TIMEOUT_SECONDS = 300
#: The node boot budget: how long a node may take from its launch to its registration on EFS
#: (instance start, the DLAMI's own boot with its GPU and EFA drivers, this user data's
#: downloads and installs, the EFS mount). The master waits this long for the nodes the
#: groups launched before it forms the cluster without them (docs/node-agent.md, "Master").
#: A Deep Learning AMI takes minutes to boot, a p5 longer than a g5; 15 minutes covers both
#: with room, and the wait ends as soon as every node registered.
DEFAULT_NODE_BOOT_SECONDS = 900
#: Shortest boot budget accepted: no GPU instance boots a DLAMI faster.
MIN_NODE_BOOT_SECONDS = 60
#: Time the setup keeps after the boot budget, to form the cluster and signal.
FORMING_SECONDS = 300


#: What one zone move adds to the setup in the worst case the stack budgets for: the moved
#: groups' first launches in the next zone and the notification of their failure (seconds
#: to a few minutes: the groups are past ``launch_retry_seconds`` by then, so the capacity
#: adjuster acts at once). A margin, not a measured figure.
ZONE_MOVE_SECONDS = 300
#: The shortest setup wait: the original template's 55 minutes.
MIN_SETUP_WAIT_SECONDS = 3300
#: The longest CloudFormation accepts for a wait condition (12 hours).
MAX_SETUP_WAIT_SECONDS = 43200


def setup_wait(node_boot_seconds: object, launch_retry_seconds: object,
               zone_moves: object, given: object = None) -> int:
    """How long the stack waits for the cluster to form: the worst case it is built for, at
    least :data:`MIN_SETUP_WAIT_SECONDS`. The first zone's launches are left to Auto Scaling
    for ``launch_retry_seconds``; each zone move then costs :data:`ZONE_MOVE_SECONDS`; in the
    last zone the master boots (up to the boot budget) and then waits the boot budget for
    the workers it does not see yet; forming and the signal take :data:`FORMING_SECONDS`.
    Defaults (900, 600, 2 moves): exactly 3300. ConfigError past CloudFormation's 12 hours
    (docs/capacity.md, "The setup wait"). ``given``: the construct's own
    ``setup_timeout_seconds``, only checked against those 12 hours."""
    if given is not None:
        return validation.count("setup_timeout_seconds", given, minimum=1,
                                maximum=MAX_SETUP_WAIT_SECONDS)
    boot = validation.positive_int("node_boot_seconds", node_boot_seconds)
    retry = validation.positive_int("launch_retry_seconds", launch_retry_seconds, minimum=0)
    moves = validation.positive_int("max_zone_moves", zone_moves, minimum=0)
    need = retry + moves * ZONE_MOVE_SECONDS + 2 * boot + FORMING_SECONDS
    if need > MAX_SETUP_WAIT_SECONDS:
        raise validation.ConfigError(
            f"the setup wait these settings need, launch_retry_seconds {retry} + "
            f"max_zone_moves {moves} x {ZONE_MOVE_SECONDS} + 2 x node_boot_seconds {boot} + "
            f"{FORMING_SECONDS} = {need} s, is longer than the {MAX_SETUP_WAIT_SECONDS} s "
            f"(12 hours) a CloudFormation wait condition allows")
    return max(MIN_SETUP_WAIT_SECONDS, need)


def boot_budget(node_boot_seconds: object, setup_timeout_seconds: object) -> int:
    """The ``node_boot_seconds`` prop checked against the setup wait it must fit in."""
    setup = validation.positive_int("setup_timeout_seconds", setup_timeout_seconds)
    return validation.count("node_boot_seconds", node_boot_seconds,
                            minimum=MIN_NODE_BOOT_SECONDS,
                            maximum=max(MIN_NODE_BOOT_SECONDS, setup - FORMING_SECONDS))


#: Attempts of each download in the user data, and the first wait between two (doubling):
#: 5+10+20+40+80 s. A node boots as soon as its subnet's route to the NAT gateway exists, but
#: S3 / the package mirror can still refuse a first request (throttling, a DNS answer not yet
#: there); one failed download would end the boot script before it signals anything.
DOWNLOAD_ATTEMPTS = 6
DOWNLOAD_FIRST_DELAY_SECONDS = 5
RETRY_FUNCTION = (
    'retry() { local n=1 delay=' + str(DOWNLOAD_FIRST_DELAY_SECONDS) + '; until "$@"; do '
    'if [ "$n" -ge ' + str(DOWNLOAD_ATTEMPTS) + ' ]; then '
    'echo "dl-bootstrap: $* failed $n times, giving up" >&2; return 1; fi; '
    'echo "dl-bootstrap: $* failed (attempt $n), retrying in ${delay}s" >&2; '
    'sleep "$delay"; n=$((n + 1)); delay=$((delay * 2)); done; }'
)


def _quote(value: str) -> str:
    """Single-quote for bash. Deploy-time tokens are quoted the same way: they resolve to
    URLs, ids and names, none of which contains a single quote."""
    return "'" + str(value).replace("'", "'\"'\"'") + "'"


def render_bootstrap_commands(
    *,
    asset_s3_url: str,
    agent_settings: Mapping[str, str],
    python: str = "python3",
    efs_utils_install: str = "",
    cloudwatch_agent_install: str = "",
    mount_s3_install: str = "",
    lustre_mount: tuple[str, str, str] | None = None,
    slurm_install: str = "",
    slurm_from_source: bool = False,
    nftables_install: str = "",
) -> list[str]:
    """Shell lines of the user data (after the shebang that CDK adds).

    ``efs_utils_install`` installs amazon-efs-utils (``mount.efs``: TLS and IAM to EFS) from
    the OS's repository. A failed install is reported here and not fatal: the agent then
    mounts without TLS, and when the file system refuses that, the master's wait-condition
    FAILURE names the missing ``mount.efs`` (a boot script that stops here signals nothing).
    ``cloudwatch_agent_install`` installs the CloudWatch agent (unless the image has it),
    which ships the node's logs; a failed install is reported and not fatal either (the
    logs then stay on the node). ``mount_s3_install`` installs Mountpoint for Amazon S3
    (``dl-run --mount``) unless the image has it; a failed install is reported and not
    fatal (a job's ``--mount`` then fails on that node, saying mount-s3 is missing).
    ``nftables_install`` installs ``nft`` unless the image has it; a failure is reported and
    not fatal (the node's executor then refuses jobs, naming the missing ``nft``, rather than
    run them with their ports open to every user).
    ``lustre_mount`` (install command, ``dns@tcp:/name``, mount point): the FSx for Lustre
    client is installed and the file system mounted (``constructs_lib/lustre_storage.py``);
    a failure is reported and not fatal (the node then has no Lustre data, and says so).
    ``slurm_install`` (``scheduler=slurm``) installs Slurm and munge unless the image has
    ``slurmd`` (``ImageFamily.slurm_install``), or with ``slurm_from_source`` what building
    them needs, then builds them once (``SLURM_BUILD_MODULE``: its downloads retry on their
    own, a bad checksum or a failed compile is not retried); a failure is fatal: a node
    without Slurm cannot run a job of a Slurm cluster, so the boot stops and the master's
    registration wait names the missing node.
    """
    args = " ".join(f"--{key} {_quote(value)}" for key, value in agent_settings.items())
    if efs_utils_install:
        efs_utils = [
            "# EFS in-transit encryption (mount -t efs -o tls,iam) needs amazon-efs-utils.",
            f"retry {efs_utils_install} || echo 'dl-bootstrap: amazon-efs-utils install failed; "
            "the EFS mount will use plain NFS' >&2",
        ]
    else:
        efs_utils = ["# This image family has no amazon-efs-utils package: the EFS mount uses "
                     "mount.efs if the AMI has it, else plain NFS."]
    cloudwatch_agent = [
        "# The CloudWatch agent ships this node's logs (the installer configures it).",
        f"[ -x /{CLOUDWATCH_AGENT_CTL} ] || retry sh -c {_quote(cloudwatch_agent_install)} || "
        "echo 'dl-bootstrap: CloudWatch agent install failed; logs stay on the node' >&2",
    ] if cloudwatch_agent_install else []
    mount_s3 = [
        "# Mountpoint for Amazon S3 streams a job's --mount data (jobs/executor/s3_mounts.py).",
        f"command -v mount-s3 >/dev/null || retry sh -c {_quote(mount_s3_install)} || "
        "echo 'dl-bootstrap: mount-s3 install failed; dl-run --mount fails on this node' >&2",
    ] if mount_s3_install else []
    nftables = [
        "# nft: what a job listens on is kept from other users (jobs/executor/listen_guard.py).",
        f"command -v nft >/dev/null || retry sh -c {_quote(nftables_install)} || "
        "echo 'dl-bootstrap: nftables install failed; this node refuses jobs' >&2",
    ] if nftables_install else []
    build = f' && PYTHONPATH={NODE_LIB_DIR} "$PY" -m {SLURM_BUILD_MODULE}' \
        if slurm_from_source else ""
    slurm = [
        "# Slurm and munge (scheduler=slurm): the image's, or installed here "
        "(docs/slurm-stack.md).",
        f"command -v slurmd >/dev/null || {{ retry sh -c {_quote(slurm_install)}{build}; }}",
    ] if slurm_install else []
    lustre = []
    if lustre_mount is not None:
        install, source, point = lustre_mount
        lustre = [
            "# FSx for Lustre (sharedStorage=fsx-lustre): the client, then the mount.",
            f"{{ retry sh -c {_quote(install)} && mkdir -p {_quote(point)} && retry mount -t "
            f"lustre -o relatime,flock {_quote(source)} {_quote(point)}; }} || echo "
            f"'dl-bootstrap: FSx for Lustre mount on {point} failed' >&2",
        ]
    return [
        "# Deep-learning cluster node bootstrap (rendered by constructs_lib.NodeGroup).",
        "set -euo pipefail",
        f"exec > >(tee -a {BOOTSTRAP_LOG}) 2>&1",
        f'PY={python}; [ -x "$PY" ] || PY=python3',
        f"mkdir -p {NODE_LIB_DIR}",
        "# every download retries with backoff (DOWNLOAD_ATTEMPTS in constructs_lib/user_data.py)",
        RETRY_FUNCTION,
        f"retry aws s3 cp --only-show-errors {_quote(asset_s3_url)} "
        "/opt/deeplearning/node-scripts.zip",
        "rm -rf /opt/deeplearning/lib/bootstrap_scripts",
        f'"$PY" -m zipfile -e /opt/deeplearning/node-scripts.zip {NODE_LIB_DIR}/bootstrap_scripts',
        *efs_utils,
        *cloudwatch_agent,
        *mount_s3,
        *nftables,
        *lustre,
        *slurm,
        '"$PY" -c \'import boto3\' 2>/dev/null || retry "$PY" -m pip install -q boto3',
        f'"$PY" -m pip show -q cryptography >/dev/null 2>&1 || retry "$PY" -m pip install -q '
        f"{CRYPTOGRAPHY_REQUIREMENT}",
        f'"$PY" -m pip show -q py-spy >/dev/null 2>&1 || retry "$PY" -m pip install -q '
        f"{PY_SPY_REQUIREMENT} || echo 'dl-bootstrap: py-spy install failed; a hung job is "
        "restarted without its stacks' >&2",
        f'"$PY" -m pip show -q tensorboard >/dev/null 2>&1 || retry "$PY" -m pip install -q '
        f"{TENSORBOARD_REQUIREMENT} || echo 'dl-bootstrap: tensorboard install failed; jobs "
        "write no TensorBoard scalars' >&2",
        f"cd {NODE_LIB_DIR}",
        f'PYTHONPATH={NODE_LIB_DIR} exec "$PY" -m {INSTALL_MODULE} {args}',
    ]


def node_user_data(
    *,
    node_type: str,
    cluster_id: str,
    master_queue_url: str,
    efs_id: str,
    mount_point: str,
    wait_handle: str,
    setup_timeout_seconds: int,
    asset_s3_url: str,
    python: str,
    efs_utils_install: str = "",
    base_workers: int | None = None,
    data_prep: str | None = None,
    max_replacements_per_hour: int | None = None,
    idle_stop_seconds: int | None = None,
    idle_stop_master_seconds: int = 0,
    release_function: str = "",
    membership_key: str = "",
    job_role_arn: str = "",
    checkpoint_url: str = "",
    node_boot_seconds: int = DEFAULT_NODE_BOOT_SECONDS,
    launch_hook: str = "",
    warm_ready_queue_url: str = "",
    worker_role_id: str = "",
    node_keys_queue_url: str = "",
    log_group: str = "",
    cloudwatch_agent_install: str = "",
    mount_s3_install: str = "",
    nftables_install: str = "",
    lustre_mount: tuple[str, str, str] | None = None,
    data_checksums: str = checksums.WARN,
    allowed_images: str = "",
    scheduler: str = NATIVE_SCHEDULER,
    munge_key_secret: str = "",
    slurm_install: str = "",
    slurm_from_source: bool = False,
) -> ec2.UserData:
    """The user data of a master or worker node: the node agent's settings
    (docs/protocol.md, "The node agent's command line"). The master's registration wait is
    the node boot budget ``node_boot_seconds``. ``launch_hook``: the worker group's launch
    lifecycle hook (a warm pool's, ``constructs_lib/warm_pool.py``): a worker says it is
    ready on ``warm_ready_queue_url``, the master completes the action of a sender that is
    a session of the workers' role (``worker_role_id``). ``node_keys_queue_url``: where a
    worker sends its public key, which the master then checks its records with
    (``constructs_lib/node_keys.py``).
    ``log_group``: the installer configures the CloudWatch agent to ship the node's logs
    there (``cloudwatch_agent_install`` installs it, ``{region}`` the stack's region).
    ``data_checksums``: every node's default ``dl-run --data-checksums`` (the installer
    writes it where dl-run reads it, ``data.checksums.SETTING_FILE``). ``scheduler``: with
    ``slurm``, the agent's ``--scheduler slurm --munge-key-secret <ARN>`` (the node role
    reads the key, ``constructs_lib/slurm.py``) and ``slurm_install`` before it; with
    ``native`` neither option is written (the agent's default)."""
    settings = {
        "role": node_type,
        "cluster-id": cluster_id,
        "stack-name": Aws.STACK_NAME,
        "region": Aws.REGION,
        "master-queue-url": master_queue_url,
        "efs-id": efs_id,
        "mount-point": mount_point,
        "wait-handle": wait_handle,
        "setup-timeout": str(setup_timeout_seconds),
        "mount-timeout": str(MOUNT_TIMEOUT_SECONDS),
        "data-checksums": data_checksums,
    }
    if allowed_images:  # the repositories dl-run --image accepts (the stack's allowedImages)
        settings["allowed-images"] = allowed_images
    if base_workers is not None:  # the master's: it decides who is a protected base worker
        settings["base-workers"] = str(base_workers)
    if node_type == "master":  # only the master waits for registrations
        settings["registration-wait"] = str(node_boot_seconds)
    if data_prep:
        settings["data-prep"] = data_prep
    if max_replacements_per_hour is not None:  # the master's: its job controller's breaker
        settings["max-replacements-per-hour"] = str(max_replacements_per_hour)
    if idle_stop_seconds is not None:  # the master's: its job controller's idle stop
        settings["idle-stop-seconds"] = str(idle_stop_seconds)
    if idle_stop_master_seconds and release_function:  # the master's own stop, later
        settings["idle-stop-master-seconds"] = str(idle_stop_master_seconds)
        settings["release-function"] = release_function
    if membership_key:  # the master signs the membership with it, workers verify
        settings["membership-key"] = membership_key
    if launch_hook:  # a warm pool's: a worker holds while Warmed:*, the master completes
        settings["launch-hook"] = launch_hook
        settings["warm-ready-queue-url"] = warm_ready_queue_url
    if worker_role_id:  # the master's: whose ready messages (and node keys) it believes
        settings["worker-role-id"] = worker_role_id
    if node_keys_queue_url:  # workers send their record-signing key, the master learns it
        settings["node-keys-queue-url"] = node_keys_queue_url
    if job_role_arn:  # the executor's: each job gets credentials of this role
        settings["job-role-arn"] = job_role_arn
    if checkpoint_url and node_type == "master":  # its controller mirrors jobs under it
        settings["checkpoint-url"] = checkpoint_url
    if log_group:  # the installer's own option (not the agent's): its log destination
        settings["log-group"] = log_group
    if scheduler != NATIVE_SCHEDULER:  # Slurm's daemons, authenticated by the munge key
        settings["scheduler"] = scheduler
        settings["munge-key-secret"] = munge_key_secret
    data = ec2.UserData.for_linux()
    data.add_commands(
        *render_bootstrap_commands(
            asset_s3_url=asset_s3_url, python=python, agent_settings=settings,
            efs_utils_install=efs_utils_install,
            cloudwatch_agent_install=cloudwatch_agent_install.replace("{region}", Aws.REGION)
            if log_group else "",
            mount_s3_install=mount_s3_install, lustre_mount=lustre_mount,
            slurm_install=slurm_install, slurm_from_source=slurm_from_source,
            nftables_install=nftables_install,
        )
    )
    return data

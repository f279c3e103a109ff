"""Install the node agent and the job executor as systemd services, and the CLI wrappers.

Run by the user data as ``python3 -m bootstrap_scripts.agent.install <agent args>``. The agent
arguments are validated here with the agent's own parser, so a bad user data fails at once,
with the offending value in cloud-init's log, instead of in a crash-looping unit.

Written under ``--root`` (default ``/``):
- ``etc/systemd/system/dl-agent.service``: ``python3 -m bootstrap_scripts.agent.node_agent <args>``,
  restarted on crashes, but not after a definite setup failure (exit 2: already signalled);
- ``etc/systemd/system/dl-executor.service``: the per-node job executor;
- ``etc/systemd/system/dl-controller.service`` (master only): the job controller, which runs
  managed jobs and restarts them after node faults (``bootstrap_scripts.jobs.controller``);
- ``usr/local/bin/{dl-run,dl-jobs,dl-health,dl-agent,dl-scale,dl-fetch-workdir,dl-container}``:
  wrappers that find this package wherever the user data unpacked it;
- ``etc/dl-cluster/aws-region.env`` and ``etc/profile.d/dl-aws-region.sh``: the instance's
  region, read from instance metadata (IMDSv2 ``placement/region``), for every unit
  (``EnvironmentFile=``), wrapper and login shell: the AWS SDKs never ask the metadata
  service for the region themselves (``bootstrap_scripts.node.node_region``).
- ``etc/dl-cluster/membership-key`` (with ``--membership-key``): the key whose signature
  root's own jobs need (``bootstrap_scripts.jobs.engine.root_jobs``): ``dl-run`` signs
  them on the master, the executors and the controller check them;
- with ``--scheduler slurm``: ``etc/systemd/system/dl-munged.service``,
  ``dl-slurmctld.service`` (master) and ``dl-slurmd.service`` (``bootstrap_scripts.slurm.units``:
  slurmd under the node's Slurm name, with its features and its GPUs as counted here);
- ``etc/dl-cluster/allowed-images``: the repositories ``dl-run --image`` accepts
  (``--allowed-images``, the stack's ``allowedImages``; ``bootstrap_scripts.containers.allow``);
- ``etc/dl-cluster/data-checksums``: the cluster's default of ``dl-run --data-checksums``
  (``--data-checksums``, the stack's ``dataChecksums``; ``bootstrap_scripts.data.checksums``);
- ``var/log/dl-cluster/{agent,executor,controller}.log``: where the units append their
  output, rotated by ``etc/logrotate.d/dl-cluster``;
- with ``--log-group``: ``opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json``,
  the CloudWatch agent's configuration (``cloudwatch_config``), which ships those files, the
  boot log and the jobs' output to the cluster's log group.
Then ``systemctl daemon-reload`` and ``systemctl enable --now`` the units and (with
``--log-group``) the CloudWatch agent on its configuration, and DCGM's host engine where
the image has it (its profiling metrics), unless ``--no-systemctl``
(tests, images being baked).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bootstrap_scripts.agent import cloudwatch_config, imds_guard
from bootstrap_scripts.agent.gpus import count_gpus
from bootstrap_scripts.agent.identity import IdentityError
from bootstrap_scripts.agent.settings import (
    EXIT_FAILED,
    EXIT_USAGE,
    SLURM_SCHEDULER,
    build_parser,
    canonical_args,
)
from bootstrap_scripts.containers import allow
from bootstrap_scripts.data import checksums
from bootstrap_scripts.jobs.engine import gate_identity, root_jobs
from bootstrap_scripts.node import node_region
from bootstrap_scripts.protocol.store import atomic_write
from bootstrap_scripts.slurm.units import render_units as render_slurm_units

UNIT_DIR = "etc/systemd/system"
BIN_DIR = "usr/local/bin"
AGENT_UNIT = "dl-agent.service"
EXECUTOR_UNIT = "dl-executor.service"
CONTROLLER_UNIT = "dl-controller.service"
WRAPPERS = {"dl-run": "bootstrap_scripts.jobs.cli.dl_run",
            "dl-jobs": "bootstrap_scripts.jobs.cli.dl_jobs",
            "dl-health": "bootstrap_scripts.ops.health",
            "dl-agent": "bootstrap_scripts.agent.node_agent",
            "dl-scale": "bootstrap_scripts.ops.scale",
            "dl-fetch-workdir": "bootstrap_scripts.jobs.cli.fetch_workdir",
            "dl-container": "bootstrap_scripts.containers.run"}
#: Seconds the installer waits for instance metadata before it falls back to the user
#: data's ``--region`` (IMDS answers within milliseconds on a running instance).
IMDS_DEADLINE_SECONDS = 30.0
#: logrotate's rule for the units' log files (relative to the node's root).
LOGROTATE_FILE = "etc/logrotate.d/dl-cluster"


def instance_region(fallback: str, *, deadline: float = IMDS_DEADLINE_SECONDS) -> str:
    """The region this instance runs in, from IMDSv2 (the identity reader the agent uses);
    ``fallback`` (the user data's ``--region``) when metadata is switched off
    (``AWS_EC2_METADATA_DISABLED=true``, botocore's own switch) or does not answer."""
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() != "true":
        from bootstrap_scripts.agent.identity import fetch_identity

        try:
            region = fetch_identity(deadline=deadline).region
        except IdentityError as exc:
            print(f"dl-install: no region from instance metadata ({exc}); using the user "
                  f"data's --region {fallback!r}", file=sys.stderr)
        else:
            if node_region.valid_region(region):
                return region
            print(f"dl-install: instance metadata gave the region {region!r}; using the user "
                  f"data's --region {fallback!r}", file=sys.stderr)
    if not node_region.valid_region(fallback):
        raise node_region.RegionError(
            f"no AWS region: instance metadata gave none and --region is {fallback!r}")
    return fallback


def this_instance_id(*, deadline: float = IMDS_DEADLINE_SECONDS) -> str:
    """This instance's id (IMDSv2), which names its log streams; IdentityError if metadata
    does not answer (the installer then fails: a node that cannot say who it is cannot
    join either)."""
    from bootstrap_scripts.agent.identity import fetch_identity

    return fetch_identity(deadline=deadline).instance_id


def logrotate_conf(root: Path) -> str:
    """logrotate's rule for the units' log files: ``copytruncate``, as systemd keeps each
    file open for appending (the CloudWatch agent reads a truncated file from its start)."""
    return (f"{root / cloudwatch_config.LOG_DIR}/*.log {{\n    daily\n    rotate 7\n"
            "    maxsize 100M\n    missingok\n    notifempty\n    compress\n"
            "    delaycompress\n    copytruncate\n}\n")


def start_cloudwatch_agent(root: Path, config: Path) -> bool:
    """``amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s -c file:<config>``: the agent
    (installed by the user data from the OS's package) takes the file and (re)starts. An
    image without the agent keeps its logs on the node only: reported, not fatal."""
    ctl = root / cloudwatch_config.CTL_PATH
    if not ctl.exists():
        print(f"dl-install: no CloudWatch agent ({ctl}); the node's logs stay on the node",
              file=sys.stderr)
        return False
    res = subprocess.run([str(ctl), "-a", "fetch-config", "-m", "ec2", "-s", "-c",
                          f"file:{config}"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        print(f"dl-install: the CloudWatch agent did not start (exit {res.returncode}): "
              f"{(res.stderr or res.stdout).strip()[-400:]}", file=sys.stderr)
    return res.returncode == 0


def systemd_quote(arg: str) -> str:
    """Quote one ExecStart argument: ``%`` is a specifier and ``$`` an expansion in unit
    files, so a presigned wait-handle URL (full of ``%2F``) must have them doubled."""
    escaped = (arg.replace("\\", "\\\\").replace('"', '\\"')
               .replace("%", "%%").replace("$", "$$"))
    return f'"{escaped}"'


def python_unit(*, description: str, python: str, package_dir: str, module: str,
                args: list[str], unit: tuple[str, ...] = (),
                service: tuple[str, ...] = (), root: str = "/", log_file: str = "") -> str:
    """A systemd unit that runs ``python -m module args`` with this package importable,
    unbuffered output and the instance's region (the region file under ``root``);
    ``unit`` / ``service`` are the lines that differ between units (ordering, restart
    policy). ``log_file``: its output (stdout and stderr) is appended to that file
    (``StandardOutput=append:``, systemd 240 and later), which the CloudWatch agent ships;
    without it, the output goes to the journal."""
    exec_start = " ".join(systemd_quote(a) for a in [python, "-m", module, *args])
    head = "\n".join([f"Description={description}", *unit])
    # EnvironmentFile= takes a bare absolute path (specifiers expanded, no quotes)
    region_file = str(node_region.env_file(root)).replace("%", "%%")
    body = "\n".join(["Type=simple", f"Environment={systemd_quote('PYTHONPATH=' + package_dir)}",
                      "Environment=PYTHONUNBUFFERED=1", f"EnvironmentFile={region_file}",
                      f"ExecStart={exec_start}", *service,
                      *((f"StandardOutput=append:{log_file.replace('%', '%%')}",
                         "StandardError=inherit") if log_file else ())])
    return f"[Unit]\n{head}\n\n[Service]\n{body}\n\n[Install]\nWantedBy=multi-user.target\n"


def agent_unit(python: str, package_dir: str, agent_args: list[str], root: str = "/",
               log_file: str = "") -> str:
    return python_unit(root=root, log_file=log_file,
        description="Deep-learning cluster node agent (membership, DEEPLEARNING_* environment)",
        python=python, package_dir=package_dir, module="bootstrap_scripts.agent.node_agent",
        args=agent_args,
        unit=(f"Documentation=file://{package_dir}/docs/node-agent.md",
              "Wants=network-online.target",
              "After=network-online.target remote-fs.target cloud-init.service"),
        service=("Restart=on-failure", "RestartSec=5",
                 "# 2: setup failed and the wait condition was told; 64: bad arguments. "
                 "Restarting won't help.",
                 f"RestartPreventExitStatus={EXIT_FAILED} {EXIT_USAGE}", "TimeoutStopSec=40"))


def executor_unit(python: str, package_dir: str, root: str, mount_point: str, *,
                  guard_imds: bool = False, job_role_arn: str = "", log_file: str = "") -> str:
    """The job executor; ``guard_imds``: it (re)installs the IMDS guard before any job
    (``imds_guard``: only root reaches instance metadata). The cluster's nodes say so; EMR's
    do not (its own daemons, YARN's and HDFS's users, read the instance role there).
    ``job_role_arn``: the role whose credentials each job gets (``job_credentials``)."""
    return python_unit(root=root, log_file=log_file,
        description="Deep-learning cluster job executor (runs this node's share of dl-run jobs)",
        python=python, package_dir=package_dir, module="bootstrap_scripts.jobs.executor",
        args=["--root", root, "--mount-point", mount_point,
              *(("--guard-imds",) if guard_imds else ()),
              *(("--job-role-arn", job_role_arn) if job_role_arn else ())],
        unit=(f"Wants={AGENT_UNIT}", f"After={AGENT_UNIT} remote-fs.target"),
        service=("Restart=always", "RestartSec=5"))


def controller_unit(python: str, package_dir: str, root: str, mount_point: str,
                    region: str, max_replacements_per_hour: int,
                    idle_stop_seconds: float = 0.0, checkpoint_url: str = "",
                    log_file: str = "", idle_stop_master_seconds: float = 0.0,
                    release_function: str = "") -> str:
    """The master's job controller. ``KillMode=process``: stopping or restarting the unit
    leaves a running attempt's runner to finish cancelling its shares (the controller
    cancels it on SIGTERM); the next controller restarts the job from its checkpoint."""
    return python_unit(root=root, log_file=log_file,
        description="Deep-learning cluster job controller (runs managed dl-run jobs, "
                    "restarts them)",
        python=python, package_dir=package_dir, module="bootstrap_scripts.jobs.controller",
        args=["--root", root, "--mount-point", mount_point, "--region", region,
              "--max-replacements-per-hour", str(max_replacements_per_hour),
              "--idle-stop-seconds", f"{idle_stop_seconds:g}",
              *(("--idle-stop-master-seconds", f"{idle_stop_master_seconds:g}",
                 "--release-function", release_function)
                if idle_stop_master_seconds and release_function else ()),
              *(("--checkpoint-url", checkpoint_url) if checkpoint_url else ())],
        unit=(f"Wants={EXECUTOR_UNIT}", f"After={EXECUTOR_UNIT} remote-fs.target"),
        service=("Restart=always", "RestartSec=5", "KillMode=process", "TimeoutStopSec=60"))


def wrapper_script(python: str, package_dir: str, module: str, root: str = "/") -> str:
    """A ``dl-*`` command. It takes the instance's region from the installed file unless the
    caller set one: SSM Run Command and Session Manager start it with no AWS settings."""
    region_file = node_region.env_file(root)
    return f"""#!/bin/sh
# Installed by bootstrap_scripts.agent.install; runs {module} from {package_dir}.
PYTHONPATH='{package_dir}'${{PYTHONPATH:+:$PYTHONPATH}}
export PYTHONPATH
if [ -z "${{AWS_REGION:-}}${{AWS_DEFAULT_REGION:-}}" ] && [ -r '{region_file}' ]; then
    set -a; . '{region_file}'; set +a
fi
exec '{python}' -m {module} "$@"
"""


def slurm_units(opts: argparse.Namespace, ns: argparse.Namespace) -> dict[str, str]:
    """The node's Slurm units: its name from its private address and its GPUs from its
    driver, as the agent will register them (IdentityError if metadata does not answer)."""
    from bootstrap_scripts.agent.identity import fetch_identity

    identity = fetch_identity(deadline=IMDS_DEADLINE_SECONDS)
    return render_slurm_units(
        python_unit, python=opts.python, package_dir=opts.package_dir, root=ns.root,
        efs=ns.mount_point, role=ns.role, address=identity.address,
        instance_type=identity.instance_type, gpus=count_gpus(ns.nvidia_smi),
        log_dir=str(Path(ns.root) / cloudwatch_config.LOG_DIR))


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """The installer's own options and the node agent's (its parser, so a bad user data
    fails here); SystemExit 2 with the message on bad arguments."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--no-systemctl", action="store_true")
    pre.add_argument("--python", default=sys.executable)
    pre.add_argument("--package-dir", default=str(Path(__file__).resolve().parent.parent))
    pre.add_argument("--log-group", default="",
                     help="ship the node's logs to this CloudWatch Logs group")
    opts, agent_argv = pre.parse_known_args(argv)
    parser = build_parser()
    ns = parser.parse_args(agent_argv)
    try:
        allow.check_entries(allow.parse_entries(ns.allowed_images))
    except ValueError as exc:
        parser.error(f"--allowed-images: {exc}")
    return opts, ns


def install(argv: list[str] | None = None) -> list[Path]:
    """Write the units and wrappers; returns the files written (changed or not)."""
    opts, ns = parse_args(argv)
    root = Path(ns.root)
    agent_args = canonical_args(ns)  # --name=value: empty values survive
    region = instance_region(ns.region)
    files = {
        # first: every unit and wrapper below reads it
        node_region.env_file(root): (node_region.render_env_file(region), 0o644),
        root / node_region.PROFILE_FILE: (node_region.render_profile(ns.root), 0o644),
        root / UNIT_DIR / AGENT_UNIT: (agent_unit(
            opts.python, opts.package_dir, agent_args, ns.root,
            log_file=str(cloudwatch_config.unit_log(root, "agent"))), 0o644),
        root / UNIT_DIR / EXECUTOR_UNIT: (
            executor_unit(opts.python, opts.package_dir, ns.root, ns.mount_point,
                          guard_imds=True, job_role_arn=ns.job_role_arn,
                          log_file=str(cloudwatch_config.unit_log(root, "executor"))), 0o644),
        root / LOGROTATE_FILE: (logrotate_conf(root), 0o644),
        # dl-run's default --data-checksums on this node (the stack's dataChecksums)
        root / checksums.SETTING_FILE: (checksums.render_setting(ns.data_checksums), 0o644),
        # the repositories dl-run --image accepts on this node (the stack's allowedImages)
        root / allow.SETTING_FILE: (allow.render_setting(allow.parse_entries(
            ns.allowed_images)), 0o644),
    }
    if ns.membership_key:  # dl-run signs root's jobs with it, the executors check them
        files[root / root_jobs.KEY_FILE] = (root_jobs.render_key_file(ns.membership_key), 0o644)
    units = [AGENT_UNIT, EXECUTOR_UNIT]
    if ns.scheduler == SLURM_SCHEDULER:
        for name, text in slurm_units(opts, ns).items():
            files[root / UNIT_DIR / name] = (text, 0o644)
            units.append(name)
    if ns.role == "master":
        files[root / UNIT_DIR / CONTROLLER_UNIT] = (controller_unit(
            opts.python, opts.package_dir, ns.root, ns.mount_point, ns.region,
            ns.max_replacements_per_hour, ns.idle_stop_seconds, ns.checkpoint_url,
            log_file=str(cloudwatch_config.unit_log(root, "controller")),
            idle_stop_master_seconds=ns.idle_stop_master_seconds,
            release_function=ns.release_function), 0o644)
        units.append(CONTROLLER_UNIT)
    for name, module in WRAPPERS.items():
        files[root / BIN_DIR / name] = (wrapper_script(opts.python, opts.package_dir, module,
                                                       ns.root), 0o755)
    agent_config = root / cloudwatch_config.CONFIG_PATH
    if opts.log_group:
        files[agent_config] = (cloudwatch_config.render(
            root=root, log_group=opts.log_group, instance_id=this_instance_id(),
            master=ns.role == "master"), 0o644)
    (root / cloudwatch_config.LOG_DIR).mkdir(mode=0o755, parents=True, exist_ok=True)
    for path, (content, mode) in files.items():
        atomic_write(path, content, mode=mode)
        path.chmod(mode)
    # before any unit starts: jobs never see a moment with the instance role in reach
    guarded = imds_guard.ensure()
    if guarded:
        print(f"dl-install: only root reaches instance metadata: {guarded}")
    try:  # the health gate's all-reduce runs as this user on every node, not as root
        print(f"dl-install: the health gate's user: {gate_identity.ensure()}")
    except gate_identity.GateIdentityError as exc:
        print(f"dl-install: {exc}: the health gate's all-reduce will run as root")
    if not opts.no_systemctl:
        for cmd in (["systemctl", "daemon-reload"],
                    ["systemctl", "enable", "--now", *units]):
            subprocess.run(cmd, check=True)
        if opts.log_group:
            start_cloudwatch_agent(root, agent_config)
        start_dcgm()
    return list(files)


#: DCGM's host engine as its packages install it (NVIDIA's DCGM install guide:
#: ``systemctl --now enable nvidia-dcgm``); the GPU DLAMIs ship DCGM, not always running.
DCGM_UNIT = "nvidia-dcgm.service"


def start_dcgm() -> bool:
    """Start DCGM's host engine where the image has it, so the executor's GPU sampler gets
    the profiling metrics (``bootstrap_scripts.metrics.dcgm_metrics``); an image without it, or a
    host engine that will not start, costs only those metrics (said, never fatal)."""
    if subprocess.run(["systemctl", "cat", DCGM_UNIT], capture_output=True,
                      check=False).returncode != 0:
        return False
    res = subprocess.run(["systemctl", "enable", "--now", DCGM_UNIT], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        print(f"dl-install: {DCGM_UNIT} did not start ({res.stderr.strip()[:200]}): no DCGM "
              "profiling metrics on this node")
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    try:
        written = install(argv)
    except (node_region.RegionError, imds_guard.GuardError, IdentityError,
            cloudwatch_config.ConfigError) as exc:
        print(f"dl-install: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"dl-install: {' '.join(exc.cmd)} failed with exit status {exc.returncode}",
              file=sys.stderr)
        return 1
    for path in written:
        print(f"dl-install: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

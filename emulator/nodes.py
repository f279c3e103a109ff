"""Emulated nodes: one per instance the Auto Scaling groups launched in moto.

A node is what a real instance's user data would produce, run on loopback:
1. its own root directory (``<root>/etc``, ``<root>/opt/deeplearning``) and the shared EFS dir;
2. its own fake IMDSv2 endpoint bound to the address moto assigned (``emulator.imds``);
3. ``python -m bootstrap_scripts.agent.install <the user data's args>`` with ``--root``,
   ``--no-mount`` and ``--no-systemctl``: the real installer writes the systemd units (the
   arguments and every process's environment: ``emulator.node_inputs``);
4. the ``ExecStart`` of ``dl-agent.service`` and ``dl-executor.service`` started as
   processes, so a drift between user data, installer and agent fails here, not on AWS.

All three processes share one process group (the IMDS server leads it): killing the
node is one ``killpg``, as losing the machine would be.

A node with ``gpus=N`` has a stand-in ``nvidia-smi`` first on its PATH (``emulator.gpus``;
``gpu_fault=True``: a failing driver). Without ``gpus``, a node of a GPU instance type gets
the stand-in with that type's GPU count (as EC2 describes it); other nodes see whatever the
host has (normally none).

Executor-only nodes (:meth:`Node.boot_executor`) are for suites that need jobs to run but no
AWS at all: the same root, installer and executor unit, no metadata endpoint and no agent;
the caller plays the agent's part with :meth:`Node.apply`, which writes the node's files
with the agent's own code (``bootstrap_scripts.agent.node_files.apply_membership``). The
executor then leads the node's process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts.agent import cloudwatch_config, imds_guard
from bootstrap_scripts.jobs.executor import listen_guard, store_guard
from bootstrap_scripts.node.procgroup import (
    Tracked,
    descendants,
    kill_pids,
    pids_in_groups,
    reap,
    signal_group,
    start_time,
    stop_groups,
)
from emulator import slurm_node, ssm_agent
from emulator.deploy import REGION, REPO_ROOT, Instance
from emulator.gpus import NODE_BIN_DIR, fake_nvidia_smi, instance_type_gpus

# A node process's environment and the installer's arguments (``node_inputs.py``); ``PYTHON``
# and ``base_env`` stay importable from here, where the demo and the tests take them.
from emulator.node_inputs import PYTHON, STATIC_CREDENTIALS, base_env, emulator_args
from emulator.node_network import executor_env
from emulator.units import (
    AGENT_UNIT,
    CONTROLLER_UNIT,
    EXECUTOR_UNIT,
    NodeError,
    restart_policy,
    unit_exec,
    unit_output,
)

#: Beside the nodes' roots: the emulator's library every node's executor preloads
#: (``emulator/node_network.py``), built once per cluster, root's.
NODE_LIB_DIR = "node-lib"
#: The CloudWatch agent's configuration and state folder (under the node's root).
CLOUDWATCH_CONFIG = cloudwatch_config.CONFIG_PATH
CLOUDWATCH_STATE = "opt/aws/amazon-cloudwatch-agent/logs/state"


@dataclass
class Node:
    instance: Instance
    role: str
    root: Path
    efs: Path
    logs: Path
    gpus: int | None = None
    gpu_fault: bool = False
    imds_url: str = ""
    group: Tracked | None = None  # the process group the node's processes join now
    groups: list[Tracked] = field(default_factory=list)  # every group the node ever led
    agent_pid: int = 0
    executor_pid: int = 0
    status: str = "created"  # running | killed | stopped | removed | launch-failed
    #: What EC2 last said of the instance once the machine stopped running there: "stopped"
    #: or "terminated" ("" while it runs). ``status`` says what happened to the machine (a
    #: killed one stays "killed"); this says what the instance is now, as EC2 lists it.
    ec2_state: str = ""
    popens: list[subprocess.Popen] = field(default_factory=list)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # imds, agent, executor
    env: dict[str, str] = field(default_factory=dict)
    exited: dict[str, float] = field(default_factory=dict)  # unit -> when its process ended
    #: Seconds between the machine answering on its metadata endpoint and its user data
    #: running: the operating system's boot, which on a Deep Learning AMI takes minutes
    #: (``make demo --boot-delay``; docs/emulator.md). 0: the user data runs at once.
    boot_delay: float = 0.0
    #: The instance profile's role (its launch template's ``IamInstanceProfile``): the
    #: metadata endpoint serves its credentials and the node's processes get no others, as
    #: on EC2. "": no instance profile (directly-built test clusters): the harness's.
    role_arn: str = ""
    instance_profile_arn: str = ""
    #: The metadata endpoint's own environment: it is EC2's side, which assumes the role
    #: with the harness's credentials, never the node's (a node with a role has none).
    ec2_env: dict[str, str] = field(default_factory=dict)

    @property
    def instance_id(self) -> str:
        return self.instance.instance_id

    @property
    def address(self) -> str:
        return self.instance.address

    @property
    def executor(self) -> subprocess.Popen | None:
        return self.procs.get("executor")

    def log_path(self, what: str) -> Path:
        """Where a process's output goes: a unit's ``StandardOutput=append:`` file when its
        unit names one (``what``: the unit's name without ``.service``), else the
        harness's log directory."""
        unit = self.root / "etc/systemd/system" / f"{what}.service"
        with contextlib.suppress(OSError):
            target = unit_output(unit.read_text())
            if target:
                return Path(target)
        return self.logs / f"{self.instance_id}-{what}.log"

    def boot(self, install_args: list[str], aws: dict[str, str], wait_handle: str) -> None:
        """Start IMDS, run the installer, start the units' processes. NodeError on failure."""
        self._prepare(aws)
        # 1. the metadata endpoint leads the node's process group (a new group in OUR
        #    session: the agent and executor can only join a group of the same session)
        self.set_target_lifecycle_state(
            "Warmed:Stopped" if self.instance.state.startswith("Warmed") else "InService")
        self.ec2_env = dict(self.env)
        self._start_imds(0)
        self.env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = self.imds_url
        self.env["AWS_EC2_METADATA_DISABLED"] = "false"
        if self.role_arn:  # the SDKs find the role's credentials where EC2 puts them
            for key in STATIC_CREDENTIALS:
                self.env.pop(key, None)
        # 2. the machine boots its OS (boot_delay), then the real installer runs, as the
        #    user data would
        if self.boot_delay > 0:
            time.sleep(self.boot_delay)
        self._install(install_args, wait_handle)
        # 3. what systemd would start
        self.agent_pid = self._start_unit(AGENT_UNIT, "agent").pid
        self.start_executor()
        if (self.root / CONTROLLER_UNIT).exists():
            self.start_controller()
        self.start_cloudwatch_agent()
        self.start_slurm_units()
        self.status = "running"
        # 4. the machine's SSM Agent registers it: Run Command reaches it (emulator.ssm_agent)
        try:
            ssm_agent.announce(self.env, self.instance_id, self.root,
                               self.group.pid if self.group else 0)
        except ssm_agent.AgentError as exc:
            raise NodeError(str(exc)) from None

    def _start_imds(self, port: int) -> None:
        """The metadata endpoint on ``port`` (0: any free one), leading a new process group."""
        imds = subprocess.Popen(
            [PYTHON, "-m", "emulator.imds", "--address", self.address, "--port", str(port),
             "--instance-id", self.instance_id, "--instance-type",
             self.instance.instance_type or "t3.micro", "--region", REGION,
             "--role-arn", self.role_arn, "--instance-profile-arn", self.instance_profile_arn,
             "--target-lifecycle-state-file", str(self.log_path("target-lifecycle-state"))],
            cwd=REPO_ROOT, env=self.ec2_env or self.env, stdout=subprocess.PIPE,
            stderr=open(self.log_path("imds"), "ab"),  # noqa: SIM115
            process_group=0, text=True)
        self._track("imds", imds, leader=True)
        line = imds.stdout.readline() if imds.stdout else ""
        imds.stdout.close()
        try:
            self.imds_url = json.loads(line)["url"]
        except (ValueError, KeyError, TypeError):
            raise NodeError(f"node {self.instance_id}: the metadata server on {self.address} "
                            f"did not start (log: {self.log_path('imds')})") from None

    def set_target_lifecycle_state(self, state: str) -> None:
        """What EC2 serves as ``autoscaling/target-lifecycle-state`` (Auto Scaling's side,
        outside the node's root: ``emulator.warm_pool``)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.log_path("target-lifecycle-state").write_text(state)

    def start_again(self, start_delay: float) -> None:
        """A stopped instance is started (it leaves a warm pool): its metadata endpoint comes
        back on the same address and port, the OS resumes for ``start_delay`` seconds, and
        systemd starts the enabled units. No user data: cloud-init runs it on the first boot
        only, so nothing is installed again."""
        port = int(self.imds_url.rsplit(":", 1)[1].strip("/"))
        self.procs.clear()
        self._start_imds(port)
        if start_delay > 0:
            time.sleep(start_delay)
        self.agent_pid = self._start_unit(AGENT_UNIT, "agent").pid
        self.start_executor()
        if (self.root / CONTROLLER_UNIT).exists():
            self.start_controller()
        self.start_slurm_units()
        self.status, self.ec2_state = "running", ""

    def install(self, install_args: list[str]) -> None:
        """Executor-only, step 1: the root and the installer (no IMDS, no agent, no AWS)."""
        self._prepare({})
        self._install(install_args, "")

    def boot_executor(self, install_args: list[str]) -> None:
        """Executor-only: the installer, then its executor unit."""
        self.install(install_args)
        self.start_executor()

    def start_executor(self) -> subprocess.Popen:
        """(Re)start ``dl-executor.service``'s process, as systemd's ``Restart=always`` would."""
        p = self._start_unit(EXECUTOR_UNIT, "executor")
        self.executor_pid = p.pid
        self.status = "running"
        return p

    def start_controller(self) -> subprocess.Popen:
        """(Re)start ``dl-controller.service``'s process (the master's job controller), in the
        node's process group like the other units."""
        return self._start_unit(CONTROLLER_UNIT, "controller")

    def start_cloudwatch_agent(self) -> subprocess.Popen | None:
        """What ``amazon-cloudwatch-agent-ctl -a fetch-config -s`` starts when the installer
        wrote the agent's configuration: the emulator's agent (``emulator.cloudwatch_agent``)
        on that same file, in the node's process group."""
        config = self.root / CLOUDWATCH_CONFIG
        if not config.exists() or self.group is None:
            return None
        with open(self.log_path("cloudwatch-agent"), "ab") as log:
            p = subprocess.Popen(
                [PYTHON, "-m", "emulator.cloudwatch_agent", "--config", str(config),
                 "--state-dir", str(self.root / CLOUDWATCH_STATE)], cwd=REPO_ROOT,
                env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                process_group=self.group.pid)
        self._track("cloudwatch-agent", p, leader=False)
        return p

    def start_slurm_units(self, units: list[str] | None = None) -> None:
        """The installer's Slurm units (``--scheduler slurm``), as ``emulator.slurm_node``
        runs them: the node's address, host name and GPU device files played."""
        units = slurm_node.installed_units(self.root) if units is None else units
        if not units:
            return
        slurm_node.check_node_root(self.root)
        slurm_node.gpu_devices(self.root, self.gpus or 0)
        for unit in units:
            p = slurm_node.start_unit(self.root, unit, self.address, self.env, self.logs)
            self.popens.append(p)
            self.procs[unit] = p

    def apply(self, membership):
        """What the node agent does with a published membership: the node's files, written
        by the agent's own code (an older generation or a non-member changes nothing)."""
        from bootstrap_scripts.agent.node_files import apply_membership

        return apply_membership(self.root, membership, instance_id=self.instance_id)

    def _prepare(self, aws: dict[str, str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.root / "etc").mkdir(exist_ok=True)
        hosts = self.root / "etc/hosts"
        if not hosts.exists():
            hosts.write_text("127.0.0.1 localhost\n")
        # The AMI's /var/tmp (sticky, writable by every user): the root volume's place for
        # data staged by dl-run --data when the instance has no instance store.
        tmp = self.root / "var/tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o1777)
        self.env = base_env(aws)
        # no metadata endpoint until boot() starts one (executor-only nodes never do): as
        # botocore's switch says, so nothing waits on 169.254.169.254
        self.env["AWS_EC2_METADATA_DISABLED"] = "true"
        if self.gpus is None:  # what AWS hands out for the instance type (emulator.gpus)
            self.gpus = instance_type_gpus(self.instance.instance_type) or None
        if self.gpus is not None or self.gpu_fault:
            bindir = fake_nvidia_smi(self.root / NODE_BIN_DIR, self.gpus or 0,
                                     fault=self.gpu_fault)
            self.env["PATH"] = f"{bindir}{os.pathsep}{self.env['PATH']}"

    def _install(self, install_args: list[str], wait_handle: str) -> None:
        args = emulator_args(install_args, root=self.root, efs=self.efs, wait_handle=wait_handle)
        res = subprocess.run(
            [PYTHON, "-m", "bootstrap_scripts.agent.install", "--no-systemctl", "--python",
             PYTHON, "--package-dir", str(REPO_ROOT), *args],
            cwd=REPO_ROOT, env=self.env, capture_output=True, text=True, timeout=60)
        self.log_path("install").write_text(res.stdout + res.stderr)
        if res.returncode != 0:
            raise NodeError(f"node {self.instance_id}: bootstrap_scripts.agent.install exited "
                            f"{res.returncode}: {(res.stderr or res.stdout).strip()[-800:]}")

    def _start_unit(self, unit: str, name: str) -> subprocess.Popen:
        """A unit's ``ExecStart`` in the node's process group (or leading a new one when the
        group is gone, e.g. an executor-only node's executor restarted)."""
        argv, unit_env = unit_exec((self.root / unit).read_text(), unit)
        if unit == EXECUTOR_UNIT and "--no-mount" not in argv:
            argv.append("--no-mount")
        if unit == EXECUTOR_UNIT:  # the node's own wildcard binds, for every job it starts
            preload, why = executor_env(self.root.parent / NODE_LIB_DIR)
            unit_env = {**unit_env, **preload}
            if why:
                with open(self.log_path("install"), "a") as note:
                    note.write(f"emulator: jobs bind as on one host: {why}\n")
        join = self.group is not None and bool(pids_in_groups([self.group.pid]))
        out = self.log_path(Path(unit).stem)
        out.parent.mkdir(parents=True, exist_ok=True)
        # where the demo says the node logs are: a link to the unit's own file
        link = self.logs / f"{self.instance_id}-{Path(unit).stem}.log"
        if out != link and not link.is_symlink():
            with contextlib.suppress(OSError):
                link.symlink_to(out)
        with open(out, "ab") as log:
            p = subprocess.Popen(argv, cwd=self.root, env={**self.env, **unit_env},
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 process_group=self.group.pid if join and self.group else 0)
        self._track(name, p, leader=not join)
        return p

    def _track(self, name: str, p: subprocess.Popen, *, leader: bool) -> None:
        self.popens.append(p)
        self.procs[name] = p
        if leader:
            self.group = Tracked(f"node {self.instance_id}", p.pid, start_time(p.pid))
            self.groups.append(self.group)

    def processes_alive(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is None]

    def restart_units(self, now: float) -> list[str]:
        """What systemd does on a running machine (its metadata endpoint up): a unit whose
        process ended is started again ``RestartSec`` later, as its ``Restart=`` says (e.g.
        a job controller that exited because the membership was not there yet). Returns
        the units restarted now. ``now``: ``time.monotonic()``."""
        imds = self.procs.get("imds")
        if self.status != "running" or imds is None or imds.poll() is not None:
            return []
        units = {"agent": AGENT_UNIT, "executor": EXECUTOR_UNIT, "controller": CONTROLLER_UNIT,
                 **{u: f"{slurm_node.UNIT_DIR}/{u}" for u in slurm_node.installed_units(self.root)}}
        restarted = []
        for name, unit in units.items():
            p = self.procs.get(name)
            if p is None or p.poll() is None:
                continue
            policy = restart_policy((self.root / unit).read_text())
            if not policy.wants(p.returncode):
                continue
            if now - self.exited.setdefault(name, now) < policy.seconds:
                continue
            del self.exited[name]
            if name in slurm_node.UNITS:
                self.start_slurm_units([name])
            elif name == "executor":
                self.start_executor()
            else:
                started = self._start_unit(unit, name)
                if name == "agent":
                    self.agent_pid = started.pid
            restarted.append(name)
        return restarted

    def stop(self, grace: float = 10.0) -> set[int]:
        """Shut the machine down (see :func:`stop_nodes`); returns the survivors (none)."""
        return stop_nodes([self], grace=grace)

    def kill(self, share_pgids: list[int]) -> None:
        """Lose the machine: SIGKILL the node's group, its job shares' groups, and every
        descendant that left them (torchrun's workers run in sessions of their own). The
        node's own processes go first, as when a machine dies: its executor must not live
        to record its shares' deaths (that record would read as the job's own SIGKILL)."""
        pgids = [*(g.pid for g in self.groups), *share_pgids]
        members = pids_in_groups(pgids)
        everything = members | descendants(members)
        for pgid in pgids:
            signal_group(pgid, signal.SIGKILL)
        kill_pids(everything)
        slurm_node.stop(self.address, sig=signal.SIGKILL, grace=0)
        for p in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        self.forget_kernel_rules()
        self.status = "killed"

    def forget_kernel_rules(self) -> None:
        """The machine is gone, and with it its kernel's netfilter rules (the installer's
        IMDS guard, :mod:`bootstrap_scripts.agent.imds_guard`, its executor's rendezvous
        store guards, :mod:`bootstrap_scripts.jobs.executor.store_guard`, and its table of
        what jobs listen on, :mod:`bootstrap_scripts.jobs.executor.listen_guard`). The emulated
        nodes share the host's kernel, so the emulator takes this node's rules away itself."""
        if self.imds_url:
            with contextlib.suppress(imds_guard.GuardError):
                imds_guard.remove(self.imds_url)
        with contextlib.suppress(store_guard.GuardError):  # its executor's store guards
            store_guard.forget(self.address)
        with contextlib.suppress(listen_guard.GuardError):  # and its listener table
            listen_guard.forget(self.address)

    def to_state(self) -> dict:
        return {"instance_id": self.instance_id, "role": self.role, "address": self.address,
                "root": str(self.root), "imds_url": self.imds_url, "status": self.status,
                "ec2_state": self.ec2_state or ("running" if self.status == "running" else ""),
                "group": self.group.to_dict() if self.group else None}


def stop_nodes(nodes: Iterable[Node], *, grace: float = 10.0,
               also: Iterable[Tracked] = ()) -> set[int]:
    """Shut machines down at once: SIGTERM every group the nodes led, and ``also`` (the
    executors stop their job shares), SIGKILL what is left after ``grace``, descendants
    that left their group included; returns the survivors (normally none)."""
    nodes = list(nodes)
    for node in nodes:  # slurmstepd leaves its slurmd's group: found by its token
        if slurm_node.installed_units(node.root):
            slurm_node.stop(node.address, grace=grace)
    left = stop_groups([*(g for n in nodes for g in n.groups), *also], grace=grace)
    for node in nodes:
        for p in node.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        reap(p.pid for p in node.popens)
        node.forget_kernel_rules()
        if node.status == "running":
            node.status = "stopped"
    return left

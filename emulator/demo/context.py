"""What one demo run knows, shared by the steps that bring the cluster up, the scenarios and
the report: the work directory, the cloud, the nodes, the jobs and what they did.

Also the console output every step uses, and ``state.json``: the process groups started so
far, written after every start so that a crash, ``--keep`` + ``--stop`` or a test can still
stop every one of them.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bootstrap_scripts.node.procgroup import Tracked
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from emulator import deploy as dp
from emulator import notifications as nt
from emulator.demo import joblog
from emulator.nodes import Node

if TYPE_CHECKING:
    from emulator.autoscaling import AutoScaling

#: The demo's own record of what it started (not a cluster protocol file).
STATE_FILE = "state.json"
#: Where the installer puts the ``dl-run`` / ``dl-health`` wrappers, under a node's root.
BIN_DIR = "usr/local/bin"


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and what to do."""


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("localhost", port))
        except OSError:
            return True
    return False


def http_json(url: str, method: str = "GET", body: dict | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raise DemoError(f"{method} {url} failed: {exc.code} {exc.read().decode()}") from None


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"


def generation_entry(m: Membership) -> dict:
    """One line of the report's membership history."""
    return {"generation": m.generation, "reason": m.reason,
            "addresses": [n.address for n in m.nodes]}


class DemoContext:
    """The run's state; every step reads and extends it."""

    def __init__(self, ns: argparse.Namespace, console) -> None:
        self.ns = ns
        self.console = console
        self.t0 = time.monotonic()
        self.created_work = not ns.work_dir
        self.work = Path(ns.work_dir or tempfile.mkdtemp(prefix="dl-demo-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        if self.created_work:
            # mkdtemp's 0700 would keep cluster users out of the nodes' files (membership,
            # node files, EFS), which a real node's users read: each file keeps its own mode
            self.work.chmod(0o755)
        #: what keeps a cluster user's job from running here ("" if nothing), said at once
        #: and again next to ``dlc submit --as`` (emulator/demo/user_access.py)
        self.user_access = ""
        self.efs = self.work / "efs"
        self.cluster_paths = ClusterPaths(self.efs)
        self.logs = self.work / "logs"
        self.cloud: Tracked | None = None
        self.cloud_popen: subprocess.Popen | None = None
        self.endpoint = ""
        self.control = ""
        self.aws: dict[str, str] = {}
        self.cluster: dp.Cluster | None = None
        self.nodes: list[Node] = []
        self.failed_launches: list[str] = []
        self.invoker: nt.LambdaInvoker | None = None
        self.timings: dict[str, float] = {}
        self.jobs: list[joblog.JobRun] = []
        self.membership: Membership | None = None
        self.generations: list[dict] = []
        self.runners: list[Tracked] = []
        self.kill_info: dict | None = None
        #: Elastic bookkeeping: ``starts`` (every worker start the job printed), and once
        #: played, ``join`` (the added node) and ``drain`` (its removal).
        self.elastic: dict = {"starts": []}
        #: the emulated Auto Scaling and EC2 once the cluster formed (emulator.autoscaling),
        #: and who wants to hear of each node it boots: ``hook(node, boot_started)``
        self.autoscaling: AutoScaling | None = None
        self.boot_hooks: list[Callable[[Node, float], None]] = []
        #: what the recovery drills did (emulator.demo.recovery), for the report
        self.recovery: dict = {}
        #: --keep: the cluster was left running, and the background service that plays
        #: Auto Scaling and EC2 for it (emulator.demo.keeper) once it runs
        self.kept = False
        self.service: Tracked | None = None
        #: --scheduler slurm (emulator.demo.slurm): the user made for the job, the
        #: directories opened for it ({dir: old mode}), the master shell, the job's record
        self.slurm: dict = {"opened": {}}

    # -- output --------------------------------------------------------------------------
    def step(self, text: str) -> None:
        self.console.print(f"[bold cyan]==>[/] [bold]{text}[/]")

    def ok(self, text: str) -> None:
        self.console.print(f"    [green]ok[/] {text}")

    def info(self, text: str) -> None:
        self.console.print(f"    {text}", highlight=False)

    # -- state (for --stop and for crash-safe teardown) -----------------------------------
    def groups(self) -> list[Tracked]:
        out = [n.group for n in self.nodes if n.group is not None]
        out += self.runners
        out += [Tracked("job share", pgid, None) for pgid in joblog.share_groups(self.efs)]
        if self.cloud is not None:
            out.append(self.cloud)
        return out

    def save_state(self) -> None:
        state = {"work_dir": str(self.work), "remove_work_dir": self.created_work,
                 "endpoint": self.endpoint, "control": self.control,
                 "cloud": self.cloud.to_dict() if self.cloud else None,
                 "nodes": [n.to_state() for n in self.nodes],
                 "runners": [r.to_dict() for r in self.runners],
                 "service": self.service.to_dict() if self.service else None,
                 "slurm": {k: v for k, v in self.slurm.items() if k in ("user", "opened")}}
        path = self.work / STATE_FILE
        try:  # what --keep added for dlc --emulator (report.record_aws) stays
            aws = json.loads(path.read_text()).get("aws")
        except (OSError, ValueError, AttributeError):
            aws = None
        if aws:
            state["aws"] = aws
        # atomically: dlc --emulator reads it while the kept cluster's service boots nodes
        tmp = path.with_name(f".{STATE_FILE}.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(path)

    # -- the cloud and the nodes ---------------------------------------------------------
    def session(self):
        import boto3

        return boto3.session.Session(region_name=dp.REGION)

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.status == "running"]

    def master(self) -> Node | None:
        return next((n for n in self.live_nodes() if n.role == "master"), None)

    def signals(self) -> list[dict]:
        """The wait-condition signals the control endpoint received."""
        try:
            return list(http_json(f"{self.control}/signals"))  # type: ignore[arg-type]
        except (DemoError, OSError):
            return []

    def adopt_membership(self, m: Membership) -> None:
        """``m`` is what every live node applied: remember it and its place in history."""
        self.membership = m
        self.generations.append(generation_entry(m))

"""``make demo``: the whole cluster lifecycle on this machine, through the real code paths.

    python -m emulator.demo [--workers N] [--fail-launches K] [--kill-node-after S]
                            [--epochs E] [--keep] [--report PATH] [--port P]
    python -m emulator.demo --stop <work dir>/state.json

moto plays AWS on localhost; the real CDK CLI deploys the stack to it; one emulated node
per instance the Auto Scaling groups launched (its own loopback address, metadata endpoint
and root directory, one shared directory as EFS) runs the node agent and job executor the
user data installs; the harness delivers the Auto Scaling notifications moto cannot send to
the real Lambda handler; then ``dl-run`` trains the example model across every node.
See docs/demo.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape

from emulator import deploy as dp
from emulator import notifications as nt
from emulator.nodes import PYTHON, Node, NodeError, base_env, check_agent_args
from emulator.procs import Tracked, descendants, pids_in_groups, start_time, stop_groups

EPOCH_RE = re.compile(r"^\[(\d+) (\S+)\] epoch=(\d+) acc=([\d.]+) loss=([\d.]+) "
                      r"samples_per_s=(\d+) world_size=(\d+)")
FINAL_RE = re.compile(r"^\[(\d+) (\S+)\] final acc=([\d.]+) world_size=(\d+)")
JOB_RE = re.compile(r"\[dl-run\] job (\S+)$")
STATE_FILE = "state.json"
#: The default data-preparation hook with --fail-data-prep: fails on a node whose address
#: the harness marked (the agent gives the hook DL_NODE_ADDRESS and EFS_MOUNT).
PREP_COMMAND = 'test ! -e "$EFS_MOUNT/emulator/prep-fail-$DL_NODE_ADDRESS"'
START_RE = re.compile(r"^\[(\d+) (\S+)\] start world_size=(\d+) restart=(\d+) step=(\d+)")
FIRST_STEP_RE = re.compile(r"^\[(\d+) (\S+)\] first_step rank=(\d+) world_size=(\d+)")


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and what to do."""


# -- options ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m emulator.demo",
        description="Deploy the cluster to a local AWS emulator (moto) with the real CDK CLI, "
                    "boot one emulated node per instance and train across them.")
    p.add_argument("--workers", type=int, default=2, help="worker count (default: 2)")
    p.add_argument("--fail-launches", type=int, default=0, metavar="K",
                   help="K worker launches fail as on AWS (default: 0)")
    p.add_argument("--kill-node-after", type=float, default=None, metavar="SECONDS",
                   help="kill one worker this many seconds after the job's first epoch "
                        "(0: at once), then recover: new membership without it, resume "
                        "from the last checkpoint on the survivors")
    p.add_argument("--elastic", action="store_true",
                   help="run the job elastic (dl-run --elastic): workers may join and leave")
    p.add_argument("--add-worker-after", type=float, default=None, metavar="SECONDS",
                   help="elastic: this many seconds after the first epoch, raise the worker "
                        "group's desired capacity by one (as dl-scale does) and boot the node")
    p.add_argument("--remove-worker-after", type=float, default=None, metavar="SECONDS",
                   help="elastic: this many seconds after the added worker joined, remove it "
                        "through the drain lifecycle hook (master and base workers are "
                        "protected)")
    p.add_argument("--data-prep", default="", metavar="COMMAND",
                   help="data-preparation command every node runs before joining "
                        "(-c dataPrepScript=...)")
    p.add_argument("--fail-data-prep", action="store_true",
                   help="the added worker's data preparation fails: it must never join")
    p.add_argument("--epochs", type=int, default=20, help="training epochs (default: 20)")
    p.add_argument("--require-acc", type=float, default=0.95,
                   help="held-out accuracy the job must reach "
                        "(default: 0.95, the example's target)")
    p.add_argument("--keep", action="store_true",
                   help="leave the emulated cluster running and print how to use and stop it")
    p.add_argument("--report", default="demo-report.json", help="report path "
                   "(default: demo-report.json)")
    p.add_argument("--port", type=int, default=0, help="moto's port on localhost "
                   "(default: a free one)")
    p.add_argument("--work-dir", default="", help="where node roots, EFS and logs go "
                   "(default: a temp dir, removed at the end unless --keep; a directory given "
                   "here is kept)")
    p.add_argument("--membership-timeout", type=float, default=120.0,
                   help="seconds to wait for all nodes to agree (default: 120)")
    p.add_argument("--stop", metavar="STATE_FILE", default="",
                   help="stop a cluster left running by --keep and remove its temp dir")
    return p


def validate(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if ns.stop:
        return
    if ns.workers < 1:
        parser.error(f"--workers must be at least 1, got {ns.workers}")
    if ns.workers > 32:
        parser.error(f"--workers {ns.workers} is more than this emulator runs on one "
                     f"machine (32 at most)")
    if ns.fail_launches < 0:
        parser.error(f"--fail-launches must be >= 0, got {ns.fail_launches}")
    if ns.fail_launches > ns.workers:
        parser.error(f"--fail-launches {ns.fail_launches} is more than --workers "
                     f"{ns.workers}: at most {ns.workers} worker launches can fail")
    if ns.kill_node_after is not None:
        if ns.kill_node_after < 0:
            parser.error(f"--kill-node-after must be >= 0 seconds, got {ns.kill_node_after}")
        if ns.workers - ns.fail_launches < 1:
            parser.error("--kill-node-after needs at least one running worker to kill "
                         f"(--workers {ns.workers}, --fail-launches {ns.fail_launches})")
    if ns.epochs < 2 and ns.kill_node_after is not None:
        parser.error(f"--kill-node-after needs --epochs >= 2 (a checkpoint to resume from), "
                     f"got {ns.epochs}")
    if (ns.add_worker_after is not None or ns.remove_worker_after is not None) and \
            not ns.elastic:
        parser.error("--add-worker-after / --remove-worker-after need --elastic")
    if ns.remove_worker_after is not None and ns.add_worker_after is None:
        parser.error("--remove-worker-after needs --add-worker-after: the master and the base "
                     "workers are protected from scale-in, only an added worker can leave")
    if ns.fail_data_prep and ns.add_worker_after is None:
        parser.error("--fail-data-prep needs --add-worker-after (the added node's hook fails)")
    for name in ("add_worker_after", "remove_worker_after"):
        if getattr(ns, name) is not None and getattr(ns, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(ns, name)}")
    if ns.elastic and ns.kill_node_after is not None:
        parser.error("--kill-node-after and --elastic are separate scenarios; pick one")
    if ns.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {ns.epochs}")
    if not 0 <= ns.require_acc <= 1:
        parser.error(f"--require-acc must be within 0..1, got {ns.require_acc}")
    if ns.port and not 1024 <= ns.port <= 65535:
        parser.error(f"--port must be 1024..65535, got {ns.port}")


# -- small helpers -------------------------------------------------------------------------


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


def global_batch(worlds: list[int], target: int = 64) -> int:
    """A global batch every world size in play divides (the example keeps it fixed)."""
    lcm = 1
    for w in worlds:
        lcm = lcm * w // math.gcd(lcm, w)
    return lcm * max(1, round(target / lcm))


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"


# -- the demo ------------------------------------------------------------------------------


@dataclass
class JobResult:
    job_id: str = ""
    exit_code: int | None = None
    resumed: bool = False
    epochs: list[dict] = field(default_factory=list)
    final_acc: float | None = None
    world_size: int = 0
    seconds: float = 0.0
    failure: str = ""
    killed: dict | None = None
    output_tail: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "exit_code": self.exit_code, "resumed": self.resumed,
                "world_size": self.world_size, "final_acc": self.final_acc,
                "seconds": round(self.seconds, 2), "failure": self.failure,
                "killed": self.killed, "epochs": self.epochs}


class Demo:
    def __init__(self, ns: argparse.Namespace, console) -> None:
        self.ns = ns
        self.console = console
        self.t0 = time.monotonic()
        self.created_work = not ns.work_dir
        self.work = Path(ns.work_dir or tempfile.mkdtemp(prefix="dl-demo-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.efs = self.work / "efs"
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
        self.jobs: list[JobResult] = []
        self.membership: dict = {}
        self.generations: list[dict] = []
        self.runners: list[Tracked] = []
        self.kill_info: dict | None = None
        self.elastic: dict = {"starts": []}

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
        out += [Tracked("job share", pgid, None) for pgid in self.share_pgids()]
        if self.cloud is not None:
            out.append(self.cloud)
        return out

    def share_pgids(self) -> list[int]:
        pgids = []
        for started in self.efs.glob("jobs/*/nodes/*.started"):
            with contextlib.suppress(OSError, ValueError):
                pgid = int(json.loads(started.read_text()).get("pgid") or 0)
                if pgid:
                    pgids.append(pgid)
        return pgids

    def save_state(self) -> None:
        state = {"work_dir": str(self.work), "remove_work_dir": self.created_work,
                 "endpoint": self.endpoint, "control": self.control,
                 "cloud": self.cloud.to_dict() if self.cloud else None,
                 "nodes": [n.to_state() for n in self.nodes],
                 "runners": [r.to_dict() for r in self.runners]}
        (self.work / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    # -- steps -----------------------------------------------------------------------------
    def check_install(self) -> None:
        self.step("checking what the demo needs")
        missing = []
        import importlib.util

        for module in ("torch", "moto", "boto3", "rich", "sklearn", "aws_cdk"):
            if importlib.util.find_spec(module) is None:  # no import: torch alone takes s
                missing.append(f"python package {module}")
        cdk = dp.REPO_ROOT / "node_modules" / ".bin" / "cdk"
        if not cdk.exists():
            missing.append(f"the CDK CLI ({cdk})")
        if shutil.which("npx") is None:
            missing.append("npx (Node.js)")
        if missing:
            raise DemoError("missing: " + ", ".join(missing) + ". Run `make setup` (or "
                            "`make demo`, which runs it first).")
        self.ok(f"python {sys.version.split()[0]}, torch, moto, boto3, CDK CLI "
                f"({cdk.relative_to(dp.REPO_ROOT)})")

    def start_cloud(self) -> None:
        self.step("starting the AWS emulator (moto) on localhost")
        port = self.ns.port
        if port and port_in_use(port):
            raise DemoError(f"port {port} on localhost is already in use: choose another "
                            f"--port, or omit it to use a free one")
        port = port or free_port("localhost")
        self.logs.mkdir(parents=True, exist_ok=True)
        self.efs.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        with open(self.logs / "cloud.log", "ab") as err:
            p = subprocess.Popen([PYTHON, "-m", "emulator.cloud", "--port", str(port),
                                  "--state-dir", str(self.work / "cloud")],
                                 cwd=dp.REPO_ROOT, env=base_env({}), stdout=subprocess.PIPE,
                                 stderr=err, stdin=subprocess.DEVNULL, text=True,
                                 start_new_session=True)
        self.cloud_popen = p
        self.cloud = Tracked("cloud (moto)", p.pid, start_time(p.pid))
        self.save_state()
        line = p.stdout.readline() if p.stdout else ""
        try:
            info = json.loads(line)
        except ValueError:
            info = {"error": f"the emulator exited without starting (log: "
                             f"{self.logs / 'cloud.log'}):\n{tail(self.logs / 'cloud.log')}"}
        if "error" in info:
            raise DemoError(str(info["error"]))
        self.endpoint, self.control = info["endpoint"], info["control"]
        self.aws = dp.aws_env(self.endpoint)
        os.environ.update(self.aws)
        os.environ.pop("AWS_PROFILE", None)
        self.timings["moto_start_s"] = time.monotonic() - t
        self.save_state()
        self.ok(f"moto at {self.endpoint} (control {self.control}) in "
                f"{self.timings['moto_start_s']:.1f} s")

    def session(self):
        import boto3

        return boto3.session.Session(region_name=dp.REGION)

    def deploy(self) -> None:
        self.step(f"deploying DLClusterStack with the real CDK CLI (workerCount="
                  f"{self.ns.workers})")
        env = dp.cli_env(self.endpoint)
        log = self.logs / "cdk.log"
        ami = dp.pick_ami(self.session().client("ec2"))
        self.timings["bootstrap_s"] = dp.bootstrap(env, log, self.work / "cdk.out")
        self.ok(f"cdk bootstrap aws://{dp.ACCOUNT}/{dp.REGION} in "
                f"{self.timings['bootstrap_s']:.1f} s")
        context = {}
        if self.ns.add_worker_after is not None:
            context["maxWorkers"] = str(self.ns.workers + 1)  # room for the added worker
        if self.ns.data_prep or self.ns.fail_data_prep:
            context["dataPrepScript"] = self.ns.data_prep or PREP_COMMAND
        self.timings["deploy_s"] = dp.deploy(env, log, self.work / "cdk.out",
                                             workers=self.ns.workers, ami=ami, context=context)
        self.cluster = dp.read_cluster(self.session())
        c = self.cluster
        self.ok(f"cdk deploy: CREATE_COMPLETE, {c.resource_count} resources in "
                f"{self.timings['deploy_s']:.1f} s (synth included; image {ami})")
        for g in c.groups.values():
            check_agent_args(g.install_args, g.name)
            self.info(f"{g.role:6} group {g.name}: desired {g.desired} (min {g.min_size}, "
                      f"max {g.max_size}), {len(g.instances)} instance(s)")
        self.info(f"capacity adjuster {c.function_name}: env "
                  + ", ".join(f"{k}" for k in sorted(c.function_env)))

    def fail_launches(self) -> None:
        k = self.ns.fail_launches
        if not k:
            return
        c = self.cluster
        self.step(f"failing {k} worker launch(es) as AWS would (insufficient capacity)")
        res = http_json(f"{self.control}/fail-launches", "POST",
                        {"group": c.worker.name, "count": k})
        self.failed_launches = list(res["instance_ids"])
        dp.refresh_instances(self.session(), c.groups.values())
        self.ok(f"{', '.join(self.failed_launches)} never came up: terminated, not in the "
                f"group; desired stays {c.worker.desired}, {len(c.worker.instances)} launched")

    def boot_nodes(self) -> None:
        c = self.cluster
        live = [(g, i) for g in (c.master, c.worker) for i in g.instances
                if i.state in ("InService", "Pending")]
        self.step(f"booting {len(live)} emulated node(s): IMDS + install + agent + executor")
        self.timings["boot_started"] = time.monotonic()
        handle = f"{self.control}/wait-handle"
        for g, inst in live:
            if not inst.address.startswith("127."):
                raise DemoError(f"instance {inst.instance_id} got address {inst.address!r}, "
                                f"not a loopback one: was the stack deployed with vpcCidr="
                                f"{dp.VPC_CIDR}?")
            node = Node(inst, g.role, self.work / "nodes" / inst.instance_id, self.efs,
                        self.logs)
            self.nodes.append(node)
            node.boot(g.install_args, self.aws, handle)
            self.save_state()
            self.info(f"{g.role:6} {inst.instance_id} {inst.address:15} imds {node.imds_url} "
                      f"agent pid {node.agent_pid}, executor pid {node.executor_pid}")
        self.ok(f"{len(live)} node(s) booted in "
                f"{time.monotonic() - self.timings['boot_started']:.1f} s")

    def notify_launches(self) -> None:
        c = self.cluster
        self.step("delivering Auto Scaling notifications (SNS shape) to the Lambda handler")
        self.invoker = nt.LambdaInvoker(c.function_name, c.function_env, self.aws,
                                        self.logs / "lambda.log")
        msgs = []
        for g in (c.master, c.worker):
            for inst in g.instances:
                msgs.append(nt.notification(nt.LAUNCH, g.name, instance_id=inst.instance_id,
                                            desired=g.desired))
        for _ in self.failed_launches:
            msgs.append(nt.notification(nt.LAUNCH_ERROR, c.worker.name, desired=c.worker.desired,
                                        instance_type=c.worker.instances[0].instance_type
                                        if c.worker.instances else ""))
        for msg in msgs:  # one invocation per notification, as SNS delivers them
            rec = self.invoker.deliver(c.topic_arn, msg)
            what = msg["EC2InstanceId"] or "(no instance)"
            self.info(f"{msg['Event'].split(':')[1]:24} {what:20} -> "
                      f"{', '.join(rec['outcomes']) or rec['error']}")
        dp.refresh_instances(self.session(), c.groups.values())
        self.ok(f"worker group now desired {c.worker.desired}, "
                f"{len(c.worker.instances)} launched")

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.status == "running"]

    def node_membership(self, node: Node) -> dict | None:
        with contextlib.suppress(OSError, ValueError):
            return json.loads((node.root / "opt/deeplearning/membership.json").read_text())
        return None

    def wait_membership(self, expected: list[Node], *, after_generation: int = 0,
                        timeout: float | None = None) -> dict:
        """Until every node in ``expected`` applied the same generation listing exactly them."""
        want = sorted(n.address for n in expected)
        deadline = time.monotonic() + (timeout or self.ns.membership_timeout)
        last = ""
        while time.monotonic() < deadline:
            docs = [self.node_membership(n) for n in expected]
            gens = {d["generation"] for d in docs if d}
            if all(docs) and len(gens) == 1 and gens.pop() > after_generation and \
                    sorted(x["address"] for x in docs[0]["nodes"]) == want:
                return docs[0]
            for n in expected:
                if n.processes_alive() != ["imds", "agent", "executor"]:
                    raise DemoError(f"node {n.instance_id} ({n.address}) lost processes: "
                                    f"alive {n.processes_alive()}; agent log:\n"
                                    f"{tail(n.log_path('dl-agent'))}")
            failure = [s for s in self.signals() if s.get("Status") == "FAILURE"]
            if failure:
                raise DemoError(f"the master signalled FAILURE to the wait condition: "
                                f"{failure[0].get('Reason')}")
            last = ", ".join(f"{n.address}:gen{(d or {}).get('generation', '-')}"
                             for n, d in zip(expected, docs, strict=True))
            time.sleep(0.2)
        raise DemoError(f"nodes did not agree on a membership of {len(want)} node(s) within "
                        f"{timeout or self.ns.membership_timeout:.0f} s (now: {last}); master "
                        f"agent log:\n{tail(expected[0].log_path('dl-agent'))}")

    def signals(self) -> list[dict]:
        try:
            return list(http_json(f"{self.control}/signals"))  # type: ignore[arg-type]
        except (DemoError, OSError):
            return []

    def wait_executors(self, nodes: list[Node], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for n in nodes:
            path = self.efs / "cluster" / "executors" / f"{n.address}.json"
            while not path.exists():
                if time.monotonic() > deadline:
                    raise DemoError(f"the job executor of {n.instance_id} ({n.address}) never "
                                    f"wrote {path}; log:\n{tail(n.log_path('dl-executor'))}")
                time.sleep(0.1)

    def form_cluster(self) -> None:
        expected = [n for n in self.nodes if n.role == "master"] + \
                   [n for n in self.nodes if n.role == "worker"]
        self.step(f"waiting for all {len(expected)} node(s) to agree on the membership")
        doc = self.wait_membership(expected)
        self.wait_executors(expected)
        self.timings["boot_to_membership_s"] = time.monotonic() - self.timings["boot_started"]
        self.membership = doc
        self.generations.append({"generation": doc["generation"], "reason": doc.get("reason"),
                                 "addresses": [x["address"] for x in doc["nodes"]]})
        sig = [s for s in self.signals() if s.get("Status") == "SUCCESS"]
        self.ok(f"generation {doc['generation']} on every node: "
                + ", ".join(f"{x['rank']}={x['address']}" for x in doc["nodes"])
                + f" ({self.timings['boot_to_membership_s']:.1f} s after boot)")
        if sig:
            self.info(f"wait condition: SUCCESS from {sig[0].get('UniqueId')}: "
                      f"{sig[0].get('Reason')}")

    # -- jobs ------------------------------------------------------------------------------
    def run_job(self, *, resume: bool, world_sizes: list[int],
                kill_after: float | None = None) -> JobResult:
        master = next(n for n in self.live_nodes() if n.role == "master")
        dl_run = master.root / "usr/local/bin/dl-run"
        port = free_port(master.address)
        train = ["-m", "bootstrap_scripts.examples.train_digits", "--epochs",
                 str(self.ns.epochs), "--require-acc", str(self.ns.require_acc),
                 "--global-batch-size", str(global_batch(world_sizes))]
        if resume:
            train.append("--resume")
        if self.ns.elastic or kill_after is not None:
            # checkpoint often and stretch the steps a little: the training itself takes only
            # ~0.2 s per epoch, and it must still be running when nodes join, leave or die
            train += ["--checkpoint-every", "4", "--step-delay", "0.03"]
        if self.ns.elastic:
            train[train.index("--global-batch-size") + 1] = "64"  # any world size works
        argv = [str(dl_run), "--root", str(master.root), "--rdzv-port", str(port),
                "--heartbeat-timeout", "4", "--fail-grace", "3", "--grace", "3",
                *(["--elastic", "--grace", "10"] if self.ns.elastic else []), "--", *train]
        self.step(("resuming" if resume else "running") + " the example job with dl-run on the "
                  f"master: {' '.join(train)}")
        res = JobResult(resumed=resume)
        t = time.monotonic()
        p = subprocess.Popen(argv, cwd=dp.REPO_ROOT, env=base_env(self.aws), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        tracked = Tracked("dl-run", p.pid, start_time(p.pid))
        self.runners.append(tracked)
        self.save_state()
        lines: queue.Queue[str | None] = queue.Queue()

        def reader() -> None:
            for line in p.stdout:  # type: ignore[union-attr]
                lines.put(line.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=reader, daemon=True).start()
        out_log = open(self.logs / f"dl-run-{len(self.jobs) + 1}.log", "w")  # noqa: SIM115
        first_epoch_at: float | None = None
        with out_log:
            while True:
                try:
                    line = lines.get(timeout=0.2)
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                if line:
                    self.elastic_line(line, res)
                    out_log.write(line + "\n")
                    res.output_tail = [*res.output_tail, line][-40:]
                    self.show_job_line(line, res)
                    if first_epoch_at is None and res.epochs:
                        first_epoch_at = time.monotonic()
                if kill_after is not None and res.killed is None and first_epoch_at and \
                        time.monotonic() - first_epoch_at >= kill_after:
                    res.killed = self.kill_worker(res.job_id)
                if self.ns.elastic and first_epoch_at:
                    self.elastic_events(first_epoch_at)
        res.exit_code = p.wait()
        self.runners.remove(tracked)
        res.seconds = time.monotonic() - t
        failed = [ln for ln in res.output_tail if "FAILED" in ln]
        res.failure = failed[-1] if failed else ""
        self.jobs.append(res)
        return res

    # -- elastic: scale-out and drain, as AWS would play them ---------------------------
    def elastic_line(self, line: str, res: JobResult) -> None:
        now = time.monotonic()
        el = self.elastic
        if m := START_RE.match(line):
            el["starts"].append({"world_size": int(m.group(3)), "step": int(m.group(5)),
                                 "at_s": round(now - self.t0, 2)})
            world = int(m.group(3))
            drain = el.get("drain")
            if drain and "continued_s" not in drain and world < drain["world_before"]:
                drain["continued_s"] = round(now - drain["t"], 2)
                self.ok(f"training continues at world size {world} without "
                        f"{drain['address']}, {drain['continued_s']:.1f} s after the "
                        f"lifecycle notice")
        elif m := FIRST_STEP_RE.match(line):
            join = el.get("join")
            if join and m.group(2) == join["address"] and "first_step_s" not in join:
                join["first_step_s"] = round(now - join["agent_started"], 2)
                join["first_step_t"] = now
                join["world_size"] = int(m.group(4))
                self.ok(f"{join['address']} took its first training step at world size "
                        f"{m.group(4)}, {join['first_step_s']:.1f} s after its agent started")

    def elastic_events(self, first_epoch_at: float) -> None:
        ns, el = self.ns, self.elastic
        now = time.monotonic()
        if ns.add_worker_after is not None and "join" not in el and \
                now - first_epoch_at >= ns.add_worker_after:
            self.scale_out()
        join = el.get("join")
        if ns.remove_worker_after is not None and join and "drain" not in el and \
                "first_step_t" in join and now - join["first_step_t"] >= ns.remove_worker_after:
            self.scale_in(join)

    def scale_out(self) -> None:
        c = self.cluster
        want = len(c.worker.instances) + 1
        self.step(f"scale-out: worker group desired capacity -> {want} (dl-scale --workers "
                  f"{want})")
        master = next(n for n in self.live_nodes() if n.role == "master")
        how = "dl-scale"
        res = subprocess.run([PYTHON, "-m", "bootstrap_scripts.scale", "--root",
                              str(master.root), "--mount-point", str(self.efs), "--workers",
                              str(want)], cwd=dp.REPO_ROOT, env=base_env(self.aws),
                             capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            how = "set_desired_capacity"
            why = (res.stderr or res.stdout).strip()[-300:]
            self.info(f"dl-scale exited {res.returncode}: {escape(why)}; setting the desired "
                      "capacity with boto3")
            self.session().client("autoscaling").set_desired_capacity(
                AutoScalingGroupName=c.worker.name, DesiredCapacity=want)
        known = {n.instance_id for n in self.nodes}
        dp.refresh_instances(self.session(), c.groups.values())
        new = [i for i in c.worker.instances if i.instance_id not in known]
        if not new:
            raise DemoError(f"the worker group launched no instance for desired {want}")
        inst = new[0]
        if self.ns.fail_data_prep:
            marker = self.efs / "emulator" / f"prep-fail-{inst.address}"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("the harness makes this node's data preparation fail\n")
        node = Node(inst, "worker", self.work / "nodes" / inst.instance_id, self.efs, self.logs)
        self.nodes.append(node)
        t = time.monotonic()
        node.boot(c.worker.install_args, self.aws, f"{self.control}/wait-handle")
        self.save_state()
        rec = self.invoker.deliver(c.topic_arn, nt.notification(
            nt.LAUNCH, c.worker.name, instance_id=inst.instance_id, desired=want))
        self.info(f"{inst.instance_id} {inst.address} booted (agent pid {node.agent_pid}); "
                  f"EC2_INSTANCE_LAUNCH -> {', '.join(rec['outcomes']) or rec['error']}")
        self.elastic["join"] = {"instance_id": inst.instance_id, "address": inst.address,
                                "agent_started": t, "how": how,
                                "at_s": round(t - self.t0, 2)}

    def scale_in(self, join: dict) -> None:
        c = self.cluster
        iid, addr = join["instance_id"], join["address"]
        self.step(f"scale-in: {iid} ({addr}) leaves through the drain lifecycle hook")
        asg = self.session().client("autoscaling")
        hook = "drain"
        hooks = asg.describe_lifecycle_hooks(AutoScalingGroupName=c.worker.name)
        if not any(h["LifecycleHookName"] == hook for h in hooks["LifecycleHooks"]):
            asg.put_lifecycle_hook(  # moto does not create hooks from CloudFormation
                LifecycleHookName=hook, AutoScalingGroupName=c.worker.name,
                LifecycleTransition=nt.TERMINATING, HeartbeatTimeout=300,
                DefaultResult="CONTINUE")
        world_before = max((s["world_size"] for s in self.elastic["starts"]), default=0)
        t = time.monotonic()
        rec = self.invoker.deliver(c.topic_arn, nt.lifecycle_notification(c.worker.name, iid))
        self.info(f"EC2_INSTANCE_TERMINATING {iid} -> {', '.join(rec['outcomes']) or rec['error']}")
        drain = {"instance_id": iid, "address": addr, "t": t, "world_before": world_before,
                 "at_s": round(t - self.t0, 2), "requested_by": "master agent"}
        self.elastic["drain"] = drain
        req = self.efs / "cluster" / "drain" / f"{iid}.json"
        deadline = time.monotonic() + 10
        while not req.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not req.exists():
            # the master agent did not turn the lifecycle notice into a drain: play its part
            drain["requested_by"] = "harness (no drain request from the master agent)"
            self.info("[yellow]no drain request from the master agent within 10 s: the "
                      "harness writes it (protocol §7 step 2)[/]")
            req.parent.mkdir(parents=True, exist_ok=True)
            req.write_text(json.dumps({"instance_id": iid, "address": addr,
                                       "requested_at": time.time(),
                                       "deadline": time.time() + 240}))
        done = req.with_suffix(".done")
        deadline = time.monotonic() + 90
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        drain["done_s"] = round(time.monotonic() - t, 2) if done.exists() else None
        self.ok(f"{done.name} written {drain['done_s']} s after the notice"
                if done.exists() else f"[yellow]no {done.name} within 90 s[/]")
        # moto has no complete_lifecycle_action: after the drain, terminate as AWS would
        asg.terminate_instance_in_auto_scaling_group(InstanceId=iid,
                                                     ShouldDecrementDesiredCapacity=True)
        node = next(n for n in self.nodes if n.instance_id == iid)
        stop_groups([node.group], grace=10)
        node.status = "removed"
        rec = self.invoker.deliver(c.topic_arn, nt.notification(nt.TERMINATE, c.worker.name,
                                                                instance_id=iid))
        self.info(f"EC2_INSTANCE_TERMINATE {iid} -> {', '.join(rec['outcomes']) or rec['error']}")
        dp.refresh_instances(self.session(), c.groups.values())

    def show_job_line(self, line: str, res: JobResult) -> None:
        if m := JOB_RE.search(line):
            res.job_id = m.group(1)
            self.info(f"job {res.job_id}")
        elif m := EPOCH_RE.match(line):
            rec = {"epoch": int(m.group(3)), "acc": float(m.group(4)),
                   "loss": float(m.group(5)), "samples_per_s": int(m.group(6)),
                   "world_size": int(m.group(7))}
            res.epochs.append(rec)
            res.world_size = rec["world_size"]
            self.info(f"epoch {rec['epoch']:3}/{self.ns.epochs}  acc {rec['acc']:.3f}  "
                      f"loss {rec['loss']:.4f}  {rec['samples_per_s']:6} samples/s  "
                      f"world size {rec['world_size']}")
        elif m := FINAL_RE.match(line):
            res.final_acc = float(m.group(3))
        elif line.startswith("[dl-run]") and ("FAILED" in line or "error" in line
                                               or "succeeded" in line or "stopping" in line
                                               or "exited" in line):
            self.info(escape(line) if "succeeded" in line else f"[yellow]{escape(line)}[/]")
        elif "resumed from" in line or "Traceback" in line or "Error" in line:
            self.info(f"[dim]{escape(line)}[/]")

    def kill_worker(self, job_id: str) -> dict:
        victim = [n for n in self.live_nodes() if n.role == "worker"][-1]
        shares = []
        jdir = self.efs / "jobs" / job_id / "nodes"
        for started in jdir.glob("*.started"):
            with contextlib.suppress(OSError, ValueError):
                rec = json.loads(started.read_text())
                if rec.get("address") == victim.address and rec.get("pgid"):
                    shares.append(int(rec["pgid"]))
        victim.kill(shares)
        self.save_state()
        at = time.monotonic() - self.t0
        self.console.print(f"    [bold red]killed worker {victim.instance_id} "
                           f"({victim.address})[/]: agent, executor, IMDS and its job share "
                           f"(process groups {[victim.group.pid, *shares]})")
        self.kill_info = {"instance_id": victim.instance_id, "address": victim.address,
                          "at_s": round(at, 2), "share_pgids": shares}
        return self.kill_info

    def recover(self, job: JobResult) -> None:
        kill = job.killed
        if kill is None:
            raise DemoError(f"the job ended before the kill ({self.ns.kill_node_after} s after "
                            f"training started): use a smaller --kill-node-after or more "
                            f"--epochs")
        if job.exit_code == 0:
            raise DemoError(f"the job succeeded although worker {kill['address']} was killed")
        if job.epochs and job.epochs[-1]["epoch"] >= self.ns.epochs:
            raise DemoError(f"training finished all {self.ns.epochs} epochs before worker "
                            f"{kill['address']} was killed: use a smaller --kill-node-after "
                            f"or more --epochs")
        named = any(kill["address"] in ln for ln in job.output_tail if "[dl-run]" in ln)
        kill["job_error"] = job.failure
        kill["job_error_names_node"] = named
        self.ok(f"the job failed with exit status {job.exit_code}"
                + (f", naming the killed node {kill['address']}" if named else ""))
        t = time.monotonic()
        c = self.cluster
        self.step("recovery: the group terminates the lost instance; its notification reaches "
                  "the Lambda")
        asg = self.session().client("autoscaling")
        asg.terminate_instance_in_auto_scaling_group(InstanceId=kill["instance_id"],
                                                     ShouldDecrementDesiredCapacity=True)
        rec = self.invoker.deliver(c.topic_arn, nt.notification(
            nt.TERMINATE, c.worker.name, instance_id=kill["instance_id"]))
        self.info(f"EC2_INSTANCE_TERMINATE {kill['instance_id']} -> {', '.join(rec['outcomes'])}")
        survivors = [n for n in self.live_nodes() if n.role == "master"] + \
                    [n for n in self.live_nodes() if n.role == "worker"]
        doc = self.wait_membership(survivors, after_generation=self.membership["generation"])
        self.membership = doc
        self.generations.append({"generation": doc["generation"], "reason": doc.get("reason"),
                                 "addresses": [x["address"] for x in doc["nodes"]]})
        kill["new_generation"] = doc["generation"]
        kill["membership_s"] = round(time.monotonic() - t, 2)
        self.ok(f"generation {doc['generation']} without {kill['address']} on all "
                f"{len(survivors)} survivor(s) in {kill['membership_s']:.1f} s")

    # -- report ----------------------------------------------------------------------------
    def node_report(self) -> list[dict]:
        out = []
        for n in self.nodes:
            reg = {}
            with contextlib.suppress(OSError, ValueError):
                reg = json.loads((self.efs / "cluster/nodes" / f"{n.instance_id}.json")
                                 .read_text())
            env_text = ""
            with contextlib.suppress(OSError):
                env_text = (n.root / "opt/deeplearning/env").read_text()
            from bootstrap_scripts.membership import parse_env_file

            env = parse_env_file(env_text)
            out.append({"instance_id": n.instance_id, "role": n.role, "address": n.address,
                        "gpus": reg.get("gpus", int(env.get("DEEPLEARNING_WORKER_GPU_COUNT",
                                                            0) or 0)),
                        "instance_type": n.instance.instance_type, "status": n.status,
                        "rank": int(env["DEEPLEARNING_NODE_RANK"])
                        if "DEEPLEARNING_NODE_RANK" in env else None,
                        "root": str(n.root), "env": env})
        for iid in self.failed_launches:
            out.append({"instance_id": iid, "role": "worker", "address": "", "gpus": 0,
                        "status": "launch-failed", "rank": None, "env": {}})
        return out

    def report(self, status: str, exit_code: int, error: str = "") -> dict:
        ns = self.ns
        running = [n for n in self.nodes if n.role == "worker" and n.status == "running"]
        main_jobs = [j for j in self.jobs if not j.resumed]
        first = main_jobs[0] if main_jobs else None
        last = self.jobs[-1] if self.jobs else None
        timings = {k: round(v, 2) for k, v in self.timings.items() if k != "boot_started"}
        timings["job_s"] = round(first.seconds, 2) if first else None
        if len(self.jobs) > 1:
            timings["resume_job_s"] = round(self.jobs[-1].seconds, 2)
        timings["total_s"] = round(time.monotonic() - self.t0, 2)
        c = self.cluster
        return {
            "status": status, "exit_code": exit_code, "error": error,
            "options": {"workers": ns.workers, "fail_launches": ns.fail_launches,
                        "kill_node_after": ns.kill_node_after, "epochs": ns.epochs,
                        "require_acc": ns.require_acc, "keep": ns.keep},
            "endpoint": self.endpoint,
            "stack": {"name": dp.STACK, "resources": c.resource_count if c else 0,
                      "cluster_id": c.cluster_id if c else "",
                      "groups": {r: {"name": g.name, "desired": g.desired, "min": g.min_size,
                                     "max": g.max_size,
                                     "instances": [i.instance_id for i in g.instances]}
                                 for r, g in (c.groups.items() if c else [])},
                      "function": c.function_name if c else "",
                      "function_env": c.function_env if c else {}},
            "counts": {"workers_requested": ns.workers,
                       "worker_launches_failed": len(self.failed_launches),
                       "workers_launched": ns.workers - len(self.failed_launches),
                       "workers_running": len(running),
                       "workers_killed": sum(n.status == "killed" for n in self.nodes),
                       "nodes_in_membership": len(self.membership.get("nodes", []))},
            "nodes": self.node_report(),
            "failed_launches": self.failed_launches,
            "notifications": self.invoker.invocations if self.invoker else [],
            "membership": {"generation": self.membership.get("generation"),
                           "nodes": [x["address"] for x in self.membership.get("nodes", [])],
                           "history": self.generations},
            "wait_condition": self.signals() if self.control else [],
            "timings": timings,
            "world_size": first.world_size if first else 0,
            "epochs": first.epochs if first else [],
            "final_acc": last.final_acc if last else None,
            "jobs": [j.to_dict() for j in self.jobs],
            "kill": self.kill_info,
            "elastic": self.elastic_report() if ns.elastic else None,
            "work_dir": str(self.work),
            "kept": ns.keep and status == "succeeded",
        }

    def elastic_report(self) -> dict:
        el = self.elastic
        sizes = [x["world_size"] for x in el["starts"]]
        distinct = [w for i, w in enumerate(sizes) if i == 0 or sizes[i - 1] != w]
        try:
            log = (self.efs / "cluster" / "membership.log").read_text().splitlines()
        except OSError:
            log = []
        gens = []
        for f in sorted((self.efs / "cluster" / "generations").glob("*.json"),
                        key=lambda p: int(p.stem) if p.stem.isdigit() else 0):
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(f.read_text())
                gens.append({"generation": doc.get("generation"), "reason": doc.get("reason"),
                             "addresses": [x["address"] for x in doc.get("nodes", [])]})
        clean = {k: {kk: vv for kk, vv in v.items() if kk not in ("t", "agent_started",
                                                                 "first_step_t")}
                 for k, v in el.items() if k in ("join", "drain")}
        prepared = sorted(p.name for p in (self.efs / "cluster" / "prepared").glob("*")
                          if p.suffix in (".ok", ".failed"))
        return {"world_sizes": distinct, "restarts": el["starts"], "membership_log": log,
                "generations": gens, "prepared": prepared,
                "join_latency_s": clean.get("join", {}).get("first_step_s"),
                "drain_latency_s": clean.get("drain", {}).get("continued_s"), **clean}

    def summary_table(self, report: dict) -> None:
        from rich.table import Table

        t = Table(title="emulated cluster", show_lines=False)
        for col in ("instance", "role", "address", "GPUs", "rank", "status"):
            t.add_column(col)
        for n in report["nodes"]:
            t.add_row(n["instance_id"], n["role"], n["address"] or "-", str(n["gpus"]),
                      "-" if n["rank"] is None else str(n["rank"]), n["status"])
        self.console.print(t)
        tm = Table(title="figures")
        tm.add_column("what")
        tm.add_column("value", justify="right")
        labels = {"moto_start_s": "moto start", "bootstrap_s": "cdk bootstrap",
                  "deploy_s": "cdk deploy (synth + deploy)",
                  "boot_to_membership_s": "boot to membership", "job_s": "training job",
                  "resume_job_s": "resumed job", "total_s": "whole demo"}
        for key, label in labels.items():
            if report["timings"].get(key) is not None:
                tm.add_row(label, f"{report['timings'][key]:.1f} s")
        tm.add_row("world size", str(report["world_size"]))
        if report["final_acc"] is not None:
            tm.add_row("final accuracy", f"{report['final_acc']:.3f}")
        if report["epochs"]:
            sps = [e["samples_per_s"] for e in report["epochs"]]
            tm.add_row("samples/s (median)", str(sorted(sps)[len(sps) // 2]))
        cnt = report["counts"]
        tm.add_row("workers requested / launched / running",
                   f"{cnt['workers_requested']} / {cnt['workers_launched']} / "
                   f"{cnt['workers_running']}")
        self.console.print(tm)

    # -- teardown ----------------------------------------------------------------------------
    def teardown(self) -> tuple[list[int], list[int]]:
        """Stop everything; returns (survivors, every PID that was running at the start)."""
        groups = self.groups()
        members = pids_in_groups(g.pid for g in groups)
        seen = sorted(members | descendants(members))
        survivors = stop_groups(groups, grace=15)
        for n in self.nodes:
            for p in n.popens:
                with contextlib.suppress(Exception):
                    p.wait(timeout=1)
            if n.status == "running":
                n.status = "stopped"
        if self.cloud_popen is not None:
            with contextlib.suppress(Exception):
                self.cloud_popen.wait(timeout=5)
        return sorted(survivors), seen

    def keep_instructions(self, report_path: Path) -> None:
        master = next((n for n in self.live_nodes() if n.role == "master"), None)
        if master is None:
            return
        env = " ".join(f"{k}={v}" for k, v in self.aws.items())
        state = self.work / STATE_FILE
        self.console.print("\n[bold]The emulated cluster is still running (--keep).[/]")
        self.console.print(
            f"  a shell with the master's environment:\n"
            f"    cd {dp.REPO_ROOT} && env {env} PYTHONPATH={dp.REPO_ROOT} "
            f"AWS_EC2_METADATA_SERVICE_ENDPOINT={master.imds_url} "
            f"bash --rcfile <(echo 'source ~/.bashrc 2>/dev/null; set -a; "
            f"source {master.root}/opt/deeplearning/env; set +a; "
            f"PATH={master.root}/usr/local/bin:{Path(PYTHON).parent}:$PATH')\n"
            f"  run a job on every node:\n"
            f"    {master.root}/usr/local/bin/dl-run --root {master.root} -- -m "
            f"bootstrap_scripts.examples.train_digits --resume --epochs {self.ns.epochs + 5}\n"
            f"  cluster health:\n"
            f"    {master.root}/usr/local/bin/dl-health --root {master.root}\n"
            f"  node files: {self.work}/nodes/<instance-id>/opt/deeplearning/, EFS: {self.efs},"
            f" logs: {self.logs}\n"
            f"  stop everything:\n"
            f"    {PYTHON} -m emulator.demo --stop {state}", highlight=False, soft_wrap=True)

    # -- main flow ---------------------------------------------------------------------------
    def run(self) -> int:
        ns = self.ns
        status, code, error = "failed", 1, ""
        try:
            self.check_install()
            self.start_cloud()
            self.deploy()
            self.fail_launches()
            self.boot_nodes()
            self.notify_launches()
            self.form_cluster()
            world = len(self.membership["nodes"])
            worlds = [world, world - 1] if ns.kill_node_after is not None else [world]
            job = self.run_job(resume=False, world_sizes=worlds,
                               kill_after=ns.kill_node_after)
            if ns.kill_node_after is not None:
                self.recover(job)
                job = self.run_job(resume=True, world_sizes=worlds)
            if job.exit_code == 0 and not job.epochs:
                raise DemoError(f"job {job.job_id} exited 0 but trained no epoch (nothing "
                                f"left to resume?): see {self.logs}")
            if job.exit_code != 0:
                raise DemoError(f"the training job failed with exit status {job.exit_code}: "
                                f"{job.failure or chr(10).join(job.output_tail[-10:])}")
            self.ok(f"job {job.job_id} succeeded: accuracy {job.final_acc}, world size "
                    f"{job.world_size}")
            status, code = "succeeded", 0
        except (DemoError, dp.DeployError, NodeError) as exc:
            error = str(exc)
            self.console.print(f"[bold red]error:[/] {exc}", highlight=False)
        except Exception as exc:  # a bug (ours or a component's): still clean up
            import traceback

            error = f"{type(exc).__name__}: {exc}"
            (self.logs / "demo-traceback.log").parent.mkdir(parents=True, exist_ok=True)
            (self.logs / "demo-traceback.log").write_text(traceback.format_exc())
            self.console.print(f"[bold red]error:[/] {error}", highlight=False)
            self.console.print(traceback.format_exc(), highlight=False, markup=False)
        except KeyboardInterrupt:
            error = "interrupted"
            code = 130
            self.console.print("[bold red]interrupted[/]: stopping everything")
        report_path = Path(ns.report).resolve()
        report = self.report(status, code, error)
        keep = ns.keep and status == "succeeded"
        try:
            if not keep:
                self.step("tearing down: every process we started, by process group")
                survivors, seen = self.teardown()
                report["leftover_pids"] = survivors
                report["stopped_pids"] = seen
                report["timings"]["total_s"] = round(time.monotonic() - self.t0, 2)
                if survivors:
                    self.console.print(f"[bold red]processes still alive: {survivors}[/]")
                    code = code or 1
                else:
                    self.ok(f"{len(self.groups())} process group(s) stopped, none left")
            else:
                self.save_state()
            report["nodes"] = self.node_report()  # statuses after teardown
            if self.created_work and not keep:
                report["work_dir_removed"] = True
        finally:
            report_path.parent.mkdir(parents=True, exist_ok=True)
            report_path.write_text(json.dumps(report, indent=2) + "\n")
            if self.created_work and not keep:
                shutil.rmtree(self.work, ignore_errors=True)
        if status == "succeeded":
            self.summary_table(report)
        self.console.print(f"report: {report_path}")
        if keep:
            self.keep_instructions(report_path)
        return code


def stop_from_state(path: str, console) -> int:
    """``--stop``: stop what a ``--keep`` run left, using the PIDs it recorded."""
    state_path = Path(path)
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError) as exc:
        console.print(f"[bold red]error:[/] cannot read state file {path}: {exc}")
        return 2
    groups = [Tracked.from_dict(n["group"]) for n in state.get("nodes", []) if n.get("group")]
    groups += [Tracked.from_dict(r) for r in state.get("runners", [])]
    efs = Path(state["work_dir"]) / "efs"
    for started in efs.glob("jobs/*/nodes/*.started"):
        with contextlib.suppress(OSError, ValueError):
            pgid = int(json.loads(started.read_text()).get("pgid") or 0)
            if pgid and pids_in_groups([pgid]):
                groups.append(Tracked("job share", pgid, None))
    if state.get("cloud"):
        groups.append(Tracked.from_dict(state["cloud"]))
    left = stop_groups(groups, grace=15)
    if left:
        console.print(f"[bold red]still alive:[/] {sorted(left)}")
        return 1
    console.print(f"stopped {len(groups)} process group(s)")
    if state.get("remove_work_dir"):
        shutil.rmtree(state["work_dir"], ignore_errors=True)
        console.print(f"removed {state['work_dir']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = build_parser()
    ns = parser.parse_args(argv)
    validate(ns, parser)
    console = Console(highlight=False, soft_wrap=True)
    if ns.stop:
        return stop_from_state(ns.stop, console)
    return Demo(ns, console).run()


if __name__ == "__main__":
    sys.exit(main())

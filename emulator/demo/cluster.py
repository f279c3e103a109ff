"""Bringing the emulated cluster up, step by step: the install check, moto, the CDK deploy,
one node per launched instance, the Auto Scaling notifications, and the wait until every
node applied the same membership.

Each step prints what it did and records its timing in the context; each failure is a
:class:`~emulator.demo.context.DemoError` that says what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from bootstrap_scripts.procgroup import Tracked, start_time
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat
from emulator import deploy as dp
from emulator import notifications as nt
from emulator.demo.context import DemoContext, DemoError, free_port, port_in_use, tail
from emulator.deploy import Instance
from emulator.nodes import PYTHON, Node, base_env, check_agent_args

#: What a node runs, in the order ``Node.processes_alive`` names them.
NODE_PROCESSES = ["imds", "agent", "executor"]


def check_install(ctx: DemoContext) -> None:
    ctx.step("checking what the demo needs")
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
    ctx.ok(f"python {sys.version.split()[0]}, torch, moto, boto3, CDK CLI "
           f"({cdk.relative_to(dp.REPO_ROOT)})")


def start_cloud(ctx: DemoContext) -> None:
    ctx.step("starting the AWS emulator (moto) on localhost")
    port = ctx.ns.port
    if port and port_in_use(port):
        raise DemoError(f"port {port} on localhost is already in use: choose another "
                        f"--port, or omit it to use a free one")
    port = port or free_port("localhost")
    ctx.logs.mkdir(parents=True, exist_ok=True)
    ctx.efs.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    with open(ctx.logs / "cloud.log", "ab") as err:
        p = subprocess.Popen([PYTHON, "-m", "emulator.cloud", "--port", str(port),
                              "--state-dir", str(ctx.work / "cloud")],
                             cwd=dp.REPO_ROOT, env=base_env({}), stdout=subprocess.PIPE,
                             stderr=err, stdin=subprocess.DEVNULL, text=True,
                             start_new_session=True)
    ctx.cloud_popen = p
    ctx.cloud = Tracked("cloud (moto)", p.pid, start_time(p.pid))
    ctx.save_state()
    line = p.stdout.readline() if p.stdout else ""
    try:
        info = json.loads(line)
    except ValueError:
        info = {"error": f"the emulator exited without starting (log: "
                         f"{ctx.logs / 'cloud.log'}):\n{tail(ctx.logs / 'cloud.log')}"}
    if "error" in info:
        raise DemoError(str(info["error"]))
    ctx.endpoint, ctx.control = info["endpoint"], info["control"]
    ctx.aws = dp.aws_env(ctx.endpoint)
    os.environ.update(ctx.aws)
    os.environ.pop("AWS_PROFILE", None)
    ctx.timings["moto_start_s"] = time.monotonic() - t
    ctx.save_state()
    ctx.ok(f"moto at {ctx.endpoint} (control {ctx.control}) in "
           f"{ctx.timings['moto_start_s']:.1f} s")


def deploy(ctx: DemoContext, context: dict[str, str]) -> None:
    """``context``: the extra ``-c key=value`` the scenario needs."""
    ctx.step(f"deploying DLClusterStack with the real CDK CLI (workerCount="
             f"{ctx.ns.workers})")
    env = dp.cli_env(ctx.endpoint)
    log = ctx.logs / "cdk.log"
    ami = dp.pick_ami(ctx.session().client("ec2"))
    ctx.timings["bootstrap_s"] = dp.bootstrap(env, log, ctx.work / "cdk.out")
    ctx.ok(f"cdk bootstrap aws://{dp.ACCOUNT}/{dp.REGION} in "
           f"{ctx.timings['bootstrap_s']:.1f} s")
    ctx.timings["deploy_s"] = dp.deploy(env, log, ctx.work / "cdk.out",
                                        workers=ctx.ns.workers, ami=ami,
                                        context=context)
    ctx.cluster = dp.read_cluster(ctx.session())
    c = ctx.cluster
    ctx.ok(f"cdk deploy: CREATE_COMPLETE, {c.resource_count} resources in "
           f"{ctx.timings['deploy_s']:.1f} s (synth included; image {ami})")
    for g in c.groups.values():
        check_agent_args(g.install_args, g.name)
        ctx.info(f"{g.role:6} group {g.name}: desired {g.desired} (min {g.min_size}, "
                 f"max {g.max_size}), {len(g.instances)} instance(s)")
    ctx.info(f"capacity adjuster {c.function_name}: env "
             + ", ".join(f"{k}" for k in sorted(c.function_env)))


def boot_node(ctx: DemoContext, inst: Instance, role: str, install_args: list[str]) -> Node:
    """One emulated node for ``inst``: recorded in the state file as soon as it started."""
    node = Node(inst, role, ctx.work / "nodes" / inst.instance_id, ctx.efs, ctx.logs)
    ctx.nodes.append(node)
    node.boot(install_args, ctx.aws, f"{ctx.control}/wait-handle")
    ctx.save_state()
    return node


def boot_nodes(ctx: DemoContext) -> None:
    c = ctx.cluster
    live = [(g, i) for g in (c.master, c.worker) for i in g.instances
            if i.state in ("InService", "Pending")]
    ctx.step(f"booting {len(live)} emulated node(s): IMDS + install + agent + executor")
    ctx.timings["boot_started"] = time.monotonic()
    for g, inst in live:
        if not inst.address.startswith("127."):
            raise DemoError(f"instance {inst.instance_id} got address {inst.address!r}, "
                            f"not a loopback one: was the stack deployed with vpcCidr="
                            f"{dp.VPC_CIDR}?")
        node = boot_node(ctx, inst, g.role, g.install_args)
        ctx.info(f"{g.role:6} {inst.instance_id} {inst.address:15} imds {node.imds_url} "
                 f"agent pid {node.agent_pid}, executor pid {node.executor_pid}")
    ctx.ok(f"{len(live)} node(s) booted in "
           f"{time.monotonic() - ctx.timings['boot_started']:.1f} s")


def outcome(rec: dict) -> str:
    """What the Lambda made of one delivery, for a console line."""
    return ", ".join(rec["outcomes"]) or rec["error"]


def notify_launches(ctx: DemoContext) -> None:
    c = ctx.cluster
    ctx.step("delivering Auto Scaling notifications (SNS shape) to the Lambda handler")
    ctx.invoker = nt.LambdaInvoker(c.function_name, c.function_env, ctx.aws,
                                   ctx.logs / "lambda.log")
    msgs = []
    for g in (c.master, c.worker):
        for inst in g.instances:
            msgs.append(nt.notification(nt.LAUNCH, g.name, instance_id=inst.instance_id,
                                        desired=g.desired))
    for _ in ctx.failed_launches:
        msgs.append(nt.notification(nt.LAUNCH_ERROR, c.worker.name, desired=c.worker.desired,
                                    instance_type=c.worker.instances[0].instance_type
                                    if c.worker.instances else ""))
    for msg in msgs:  # one invocation per notification, as SNS delivers them
        rec = ctx.invoker.deliver(c.topic_arn, msg)
        what = msg["EC2InstanceId"] or "(no instance)"
        ctx.info(f"{msg['Event'].split(':')[1]:24} {what:20} -> {outcome(rec)}")
    dp.refresh_instances(ctx.session(), c.groups.values())
    ctx.ok(f"worker group now desired {c.worker.desired}, "
           f"{len(c.worker.instances)} launched")


def node_membership(node: Node) -> Membership | None:
    """The membership ``node`` applied, None before the first (or while unreadable)."""
    try:
        return Membership.load(NodePaths(node.root).membership)
    except (OSError, ValueError):
        return None


def wait_membership(ctx: DemoContext, expected: list[Node], *, after_generation: int = 0,
                    timeout: float | None = None) -> Membership:
    """Until every node in ``expected`` applied the same generation listing exactly them."""
    want = sorted(n.address for n in expected)
    deadline = time.monotonic() + (timeout or ctx.ns.membership_timeout)
    last = ""
    while time.monotonic() < deadline:
        docs = [node_membership(n) for n in expected]
        gens = {d.generation for d in docs if d}
        if all(docs) and len(gens) == 1 and gens.pop() > after_generation and \
                sorted(x.address for x in docs[0].nodes) == want:
            return docs[0]
        for n in expected:
            if n.processes_alive() != NODE_PROCESSES:
                raise DemoError(f"node {n.instance_id} ({n.address}) lost processes: "
                                f"alive {n.processes_alive()}; agent log:\n"
                                f"{tail(n.log_path('dl-agent'))}")
        failure = [s for s in ctx.signals() if s.get("Status") == "FAILURE"]
        if failure:
            raise DemoError(f"the master signalled FAILURE to the wait condition: "
                            f"{failure[0].get('Reason')}")
        last = ", ".join(f"{n.address}:gen{d.generation if d else '-'}"
                         for n, d in zip(expected, docs, strict=True))
        time.sleep(0.2)
    raise DemoError(f"nodes did not agree on a membership of {len(want)} node(s) within "
                    f"{timeout or ctx.ns.membership_timeout:.0f} s (now: {last}); master "
                    f"agent log:\n{tail(expected[0].log_path('dl-agent'))}")


def wait_executors(ctx: DemoContext, nodes: list[Node], timeout: float = 60) -> None:
    """Until every node's job executor wrote its heartbeat."""
    deadline = time.monotonic() + timeout
    for n in nodes:
        path = ctx.cluster_paths.executor_heartbeat(n.address)
        while store.read_record_or_none(path, ExecutorHeartbeat) is None:
            if time.monotonic() > deadline:
                raise DemoError(f"the job executor of {n.instance_id} ({n.address}) never "
                                f"wrote {path}; log:\n{tail(n.log_path('dl-executor'))}")
            time.sleep(0.1)


def masters_first(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.role == "master"] + [n for n in nodes if n.role == "worker"]


def form_cluster(ctx: DemoContext) -> None:
    expected = masters_first(ctx.nodes)
    ctx.step(f"waiting for all {len(expected)} node(s) to agree on the membership")
    doc = wait_membership(ctx, expected)
    wait_executors(ctx, expected)
    ctx.timings["boot_to_membership_s"] = time.monotonic() - ctx.timings["boot_started"]
    ctx.adopt_membership(doc)
    sig = [s for s in ctx.signals() if s.get("Status") == "SUCCESS"]
    ctx.ok(f"generation {doc.generation} on every node: "
           + ", ".join(f"{x.rank}={x.address}" for x in doc.nodes)
           + f" ({ctx.timings['boot_to_membership_s']:.1f} s after boot)")
    if sig:
        ctx.info(f"wait condition: SUCCESS from {sig[0].get('UniqueId')}: "
                 f"{sig[0].get('Reason')}")

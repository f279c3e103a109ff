"""Bringing the emulated cluster up, step by step: the install check, moto, the CDK deploy,
one node per launched instance, the Auto Scaling notifications, and the wait until every
node applied the same membership.

Each step prints what it did and records its timing in the context; each failure is a
:class:`~emulator.demo.context.DemoError` that says what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.markup import escape

from bootstrap_scripts.node.procgroup import Tracked, start_time
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat
from emulator import deploy as dp
from emulator import notifications as nt
from emulator import service_quotas
from emulator.address_space import vpc_cidr
from emulator.autoscaling import AutoScaling
from emulator.demo.context import DemoContext, DemoError, free_port, port_in_use, tail
from emulator.deploy import Instance
from emulator.node_inputs import PYTHON, base_env, check_agent_args
from emulator.nodes import Node

#: What every node runs (the master also its job controller), as ``Node.processes_alive``
#: names them.
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
    if ctx.ns.keep:  # the kept cluster's jobs run as cluster users (dlc submit --as)
        from emulator.demo import user_access

        ctx.user_access = user_access.problem()
        if ctx.user_access:
            ctx.console.print(f"    [bold yellow]note[/] {escape(ctx.user_access)}",
                              highlight=False, soft_wrap=True)


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
    # a new account has 0 vCPUs of G instances: the operator's increase comes first, as on
    # AWS (emulator/vcpu_quotas.py refuses launches above the quota)
    if service_quotas.request_operator_increases(ctx.session().client("service-quotas")):
        ctx.ok(f"Service Quotas: the operator's increase to {service_quotas.OPERATOR_VCPUS:g} "
               f"vCPUs per EC2 instance class approved")
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


def boot_node(ctx: DemoContext, inst: Instance, role: str, install_args: list[str], *,
              gpu_fault: bool = False) -> Node:
    """One emulated node for ``inst``: recorded in the state file as soon as it started.
    ``gpu_fault``: its GPU driver fails (``emulator.gpus``), so the health gate fails it."""
    group = ctx.cluster.groups.get(role) if ctx.cluster else None
    node = Node(inst, role, ctx.work / "nodes" / inst.instance_id, ctx.efs, ctx.logs,
                gpu_fault=gpu_fault, boot_delay=getattr(ctx.ns, "boot_delay", 0.0),
                role_arn=group.role_arn if group else "",
                instance_profile_arn=group.instance_profile_arn if group else "")
    with _BOOT_LOCK:
        ctx.nodes.append(node)
    node.boot(install_args, ctx.aws, f"{ctx.control}/wait-handle")
    with _BOOT_LOCK:
        ctx.save_state()
    return node


#: boot_node may run in several threads at once (``--boot-delay``: the first nodes boot in
#: parallel, as machines do): the node list and the state file are updated one at a time.
_BOOT_LOCK = threading.Lock()


#: The demo's EC2 status-check delay: a machine whose processes are all dead is marked
#: Unhealthy after this long. On AWS the status checks take minutes, so a job controller
#: (its executor heartbeat timeout is 4 s here) reports a lost worker first; the lost master
#: (nobody left to report it) is found by this check alone.
STATUS_CHECK_S = 8.0


def autoscaling(ctx: DemoContext) -> AutoScaling:
    """The emulated Auto Scaling and EC2 (``emulator.autoscaling``) for this run: a new
    instance boots with :func:`boot_node` from its group's user data (then every
    ``ctx.boot_hooks(node, boot_started)``),
    the topic's notifications go to the Lambda, and actions are printed."""
    c = ctx.cluster

    def boot(inst: Instance, role: str) -> Node:
        t = time.monotonic()
        node = boot_node(ctx, inst, role, c.groups[role].install_args)
        for hook in ctx.boot_hooks:
            hook(node, t)
        return node

    def say(line: str) -> None:
        ctx.info(escape(line))

    return AutoScaling(ctx.session(), {role: g.name for role, g in c.groups.items()},
                       nodes=lambda: list(ctx.nodes), boot=boot,
                       topic=nt.TopicSubscription(ctx.control, c.topic_arn, ctx.invoker),
                       say=say, status_check_seconds=STATUS_CHECK_S)


def boot_nodes(ctx: DemoContext) -> None:
    c = ctx.cluster
    live = [(g, i) for g in (c.master, c.worker) for i in g.instances
            if i.state in ("InService", "Pending")]
    ctx.step(f"booting {len(live)} emulated node(s): IMDS + install + agent + executor")
    ctx.timings["boot_started"] = time.monotonic()
    # --unhealthy-node: the last worker's GPU driver fails (the health gate's to find)
    faulty = [i for g, i in live if g.role == "worker"][-1:] if ctx.ns.unhealthy_node else []
    for _g, inst in live:
        if not inst.address.startswith("127."):
            raise DemoError(f"instance {inst.instance_id} got address {inst.address!r}, "
                            f"not a loopback one: was the stack deployed with vpcCidr="
                            f"{vpc_cidr()}?")
    # With a boot delay the machines boot side by side, as EC2's do; without one, in turn.
    def boot(gi: tuple) -> Node:
        return boot_node(ctx, gi[1], gi[0].role, gi[0].install_args, gpu_fault=gi[1] in faulty)

    if getattr(ctx.ns, "boot_delay", 0.0) > 0:
        with ThreadPoolExecutor(len(live)) as pool:
            nodes = list(pool.map(boot, live))
    else:
        nodes = [boot(gi) for gi in live]
    for (g, inst), node in zip(live, nodes, strict=True):
        ctx.info(f"{g.role:6} {inst.instance_id} {inst.address:15} imds {node.imds_url} "
                 f"agent pid {node.agent_pid}, executor pid {node.executor_pid}"
                 + (" [yellow](failing GPU driver)[/]" if inst in faulty else ""))
        if inst in faulty:
            ctx.recovery["unhealthy"] = {"instance_id": inst.instance_id,
                                         "address": inst.address}
    ctx.ok(f"{len(live)} node(s) booted in "
           f"{time.monotonic() - ctx.timings['boot_started']:.1f} s")


def outcome(rec: dict) -> str:
    """What the Lambda made of one delivery, for a console line."""
    return ", ".join(rec["outcomes"]) or rec["error"]


def failed_instance_types(ctx: DemoContext) -> list[str]:
    """The instance type of each failed launch (EC2 still describes terminated instances),
    so the launch-error notification names it as AWS's status message would."""
    if not ctx.failed_launches:
        return []
    res = ctx.session().client("ec2").describe_instances(InstanceIds=ctx.failed_launches)
    types = {i["InstanceId"]: i["InstanceType"] for r in res["Reservations"]
             for i in r["Instances"]}
    return [types.get(iid, "") for iid in ctx.failed_launches]


def decision_reasons(log: Path, offset: int) -> list[str]:
    """The ``reason`` of every decision the Lambda logged after byte ``offset`` of its log."""
    out = []
    with contextlib.suppress(OSError), open(log, "rb") as f:
        f.seek(offset)
        for line in f.read().decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if rec.get("msg") == "decision" and rec.get("reason"):
                    out.append(rec["reason"])
    return out


#: vCPUs of the demo's instance type (g5.xlarge), for the vCPU quota --fail-launches plays.
VCPUS_PER_NODE = 4


def function_wants_handle(ctx: DemoContext) -> bool:
    """The deployed template gives the capacity adjuster the wait-condition handle
    (``WAIT_HANDLE_URL``: a Ref moto's CloudFormation drops, as it drops the handle)."""
    template = ctx.work / "cdk.out" / f"{dp.STACK}.template.json"
    with contextlib.suppress(OSError, ValueError):
        resources = json.loads(template.read_text()).get("Resources", {})
        return any("WAIT_HANDLE_URL" in ((r.get("Properties") or {}).get("Environment") or {})
                   .get("Variables", {}) for r in resources.values()
                   if r.get("Type") == "AWS::Lambda::Function")
    return False


def notify_launches(ctx: DemoContext) -> None:
    c = ctx.cluster
    ctx.step("delivering Auto Scaling notifications (SNS shape) to the Lambda handler")
    ctx.info("[dim]event -> what the Lambda sent the master (asg-setup-success: group set up, "
             "asg-setup-failure: below its minimum, wait: launches under way; docs/demo.md)[/]")
    log = ctx.logs / "lambda.log"
    env = dict(c.function_env)
    if function_wants_handle(ctx) and not env.get("WAIT_HANDLE_URL", "").startswith("http"):
        # moto resolves the handle to nothing; the emulator serves it, as for the master
        env["WAIT_HANDLE_URL"] = f"{ctx.control}/wait-handle"
    ctx.invoker = nt.LambdaInvoker(c.function_name, env, ctx.aws, log)
    msgs = []
    for g in (c.master, c.worker):
        for inst in g.instances:
            msgs.append(nt.notification(nt.LAUNCH, g.name, instance_id=inst.instance_id,
                                        desired=g.desired))
    # --fail-launches: launches that fail for good, as over the account's vCPU quota (a
    # final cause: the Lambda acts at once; a transient one is --flaky-launches's drill)
    launched = len(c.master.instances) + len(c.worker.instances)
    for itype in failed_instance_types(ctx):
        msgs.append(nt.notification(
            nt.LAUNCH_ERROR, c.worker.name, desired=c.worker.desired, instance_type=itype,
            status_message=nt.VCPU_LIMIT.format(limit=VCPUS_PER_NODE * launched)))
    outcomes = []
    for msg in msgs:  # one invocation per notification, as SNS delivers them
        offset = log.stat().st_size if log.exists() else 0
        rec = ctx.invoker.deliver(c.topic_arn, msg)
        outcomes += rec["outcomes"]
        what = msg["EC2InstanceId"] or "(no instance)"
        ctx.info(f"{msg['Event'].split(':')[1]:24} {what:20} -> {outcome(rec)}")
        if msg["Event"] == nt.LAUNCH_ERROR:  # what the Lambda decided, in its own words
            for reason in decision_reasons(log, offset):
                ctx.info(f"[dim]    {escape(reason)}[/]")
    dp.refresh_instances(ctx.session(), c.groups.values())
    w = c.worker
    if "asg-setup-failure" in outcomes:
        ctx.info(f"[bold red]failed[/] worker group below its minimum ({w.min_size}): "
                 f"{len(w.instances)} of {w.desired} launched; the Lambda reported the failure "
                 f"and the master will fail the cluster's setup")
    else:
        ctx.ok(f"worker group now desired {w.desired}, {len(w.instances)} launched")


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
        lost = next((n for n in expected
                     if set(NODE_PROCESSES) - set(n.processes_alive())), None)
        # read after the liveness check: a master agent signals FAILURE, then exits (2), so
        # a FAILURE is the cause of a lost agent, never the other way round
        failure = [s for s in ctx.signals() if s.get("Status") == "FAILURE"]
        if lost is not None and not failure:
            raise DemoError(f"node {lost.instance_id} ({lost.address}) lost processes: "
                            f"alive {lost.processes_alive()}; agent log:\n"
                            f"{tail(lost.log_path('dl-agent'))}")
        if failure:
            hint = ""
            if ctx.failed_launches and ctx.cluster and \
                    len(ctx.cluster.worker.instances) < ctx.cluster.worker.min_size:
                hint = (f" (--fail-launches {len(ctx.failed_launches)} left fewer workers "
                        f"than the worker group's minimum, {ctx.cluster.worker.min_size})")
            raise DemoError(f"the master failed the cluster's setup (wait condition FAILURE)"
                            f"{hint}: {failure[0].get('Reason')}")
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

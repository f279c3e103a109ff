"""The demo's capacity scenario: ``--capacity-out TYPE[@ZONE]`` and ``--context KEY=VALUE``.

Before the deploy, the emulated EC2 is told which instance types have no capacity
(``emulator.capacity``: everywhere, or in one zone), and ``--context`` settings go to
``cdk deploy`` as ``-c KEY=VALUE`` (for example ``workerInstanceTypes=g6.xlarge,g4dn.xlarge``
or ``placementGroup=true``). Then AWS plays itself: a mixed instances group launches its
next type; a group with nothing left in its zone publishes launch errors, which reach the
real Lambda; for a single-zone cluster the Lambda moves both groups to the next zone, the
groups refill there, and the new instances boot (``emulator.autoscaling``), before the
demo waits for the membership as usual. The report's ``capacity`` section lists what was
out, where each node runs and on what, and every decision the Lambda logged with its cause.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

from rich.markup import escape

from bootstrap_scripts.protocol import launches
from emulator import capacity as emulated
from emulator.demo import cluster
from emulator.demo.context import DemoContext, DemoError, http_json

#: How long the groups may take to settle (launch errors delivered, moves made, refilled,
#: booted) before the demo gives up saying what is missing.
SETTLE_TIMEOUT_S = 90.0
#: Context keys the demo sets itself (``emulator.deploy``); --context may not change them.
RESERVED_KEYS = ("vpcCidr", "amiId", "workerCount")
#: Lambda log messages the report keeps (docs/capacity-adjuster.md, "Logs").
DECISION_MESSAGES = ("zone-decision", "group-moved", "instance-replaced", "capacity-lowered")


def validate(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Reject bad ``--capacity-out`` / ``--context`` values (exit 2, naming the option)."""
    for spec in ns.capacity_out:
        try:
            emulated.parse_spec(spec)
        except ValueError as exc:
            parser.error(f"--capacity-out: {exc}")
    for pair in ns.context:
        key, sep, _value = pair.partition("=")
        if not sep or not key.strip():
            parser.error(f"--context must be KEY=VALUE, got {pair!r}")
        if key.strip() in RESERVED_KEYS:
            parser.error(f"--context {key.strip()} is set by the demo itself "
                         f"(--workers for workerCount)")


def deploy_context(ctx: DemoContext) -> dict[str, str]:
    """Tell the emulated EC2 what is out; the ``-c`` settings ``--context`` asked for."""
    ns = ctx.ns
    if ns.capacity_out:
        res = http_json(f"{ctx.control}/capacity-out", "POST", {"out": list(ns.capacity_out)})
        ctx.info(f"no EC2 capacity for: {', '.join(res['out'])} (emulator.capacity)")
    pairs = [p.partition("=") for p in ns.context]
    return {k.strip(): v.strip() for k, _sep, v in pairs}


def _groups_settled(ctx: DemoContext) -> str:
    """"" when every group has its desired instances, each with a booted node; else what
    is still missing, for the console and the error."""
    described = ctx.session().client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[g.name for g in ctx.cluster.groups.values()])
    booted = {n.instance_id for n in ctx.nodes if n.status == "running"}
    for group in described["AutoScalingGroups"]:
        ids = [i["InstanceId"] for i in group["Instances"]
               if i["LifecycleState"] in ("InService", "Pending")]
        if len(ids) < group["DesiredCapacity"]:
            return (f"{group['AutoScalingGroupName']}: {len(ids)} of "
                    f"{group['DesiredCapacity']} instance(s)")
        if not set(ids) <= booted:
            return f"{group['AutoScalingGroupName']}: instances still booting"
    return ""


def settle(ctx: DemoContext) -> None:
    """With capacity out: let Auto Scaling, EC2 and the Lambda act until the groups are full
    and booted (the launch errors delivered, the zone moves made)."""
    if not ctx.ns.capacity_out:
        return
    ctx.step("capacity is short: Auto Scaling's launch errors go to the Lambda, the groups "
             "refill where capacity is")
    ctx.autoscaling = ctx.autoscaling or cluster.autoscaling(ctx)
    log = ctx.logs / "lambda.log"
    seen = 0
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    missing = "not checked yet"
    while time.monotonic() < deadline:
        ctx.autoscaling.tick(force=True)
        lines = decisions(log)
        for rec in lines[seen:]:
            ctx.info(f"[dim]lambda {rec['msg']}: {escape(_say(rec))}[/]")
        seen = len(lines)
        missing = _groups_settled(ctx)
        if not missing:
            ctx.ok("groups at their desired capacity, every instance booted")
            return
        time.sleep(0.3)
    raise DemoError(f"the groups did not settle within {SETTLE_TIMEOUT_S:.0f} s ({missing}); "
                    f"the Lambda's log: {log}")


def _say(rec: dict) -> str:
    if rec["msg"] == "zone-decision":
        return f"{rec.get('action')} ({rec.get('reason')})"
    if rec["msg"] == "group-moved":
        return f"{rec.get('moved_asg')} -> {rec.get('zone')} ({rec.get('subnet')})"
    if rec["msg"] == "instance-replaced":
        return f"{rec.get('instance')} of {rec.get('moved_asg')} replaced in {rec.get('zone')}"
    return f"{rec.get('asg')}: desired {rec.get('previous_desired')} -> {rec.get('new_desired')}"


def decisions(log) -> list[dict]:
    """The capacity decisions the Lambda logged, in order (its JSON log lines)."""
    out = []
    with contextlib.suppress(OSError), open(log) as fh:
        for line in fh:
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict) and rec.get("msg") in DECISION_MESSAGES:
                    out.append(rec)
    return out


def report(ctx: DemoContext) -> dict | None:
    """The report's ``capacity`` section (None without ``--capacity-out``/``--context``)."""
    ns = ctx.ns
    if not ns.capacity_out and not ns.context:
        return None
    nodes: list[dict] = []
    live = [n for n in ctx.nodes if n.status in ("running", "stopped")]
    if live and ctx.control:
        with contextlib.suppress(Exception):
            res = ctx.session().client("ec2").describe_instances(
                InstanceIds=[n.instance_id for n in live])
            info = {i["InstanceId"]: i for r in res["Reservations"] for i in r["Instances"]}
            nodes = [{"instance_id": n.instance_id, "role": n.role, "address": n.address,
                      "instance_type": info[n.instance_id]["InstanceType"],
                      "zone": info[n.instance_id]["Placement"]["AvailabilityZone"]}
                     for n in live if n.instance_id in info]
    recorded = launches.launch_failures(ctx.cluster_paths) if ctx.cluster else ()
    return {
        "out": list(ns.capacity_out),
        "context": dict(p.partition("=")[::2] for p in ns.context),
        "nodes": nodes,
        "decisions": [{k: v for k, v in rec.items() if k not in ("ts", "request_id")}
                      for rec in decisions(ctx.logs / "lambda.log")],
        "launch_failures": [a.to_dict() for a in recorded],
    }

"""The demo's capacity scenarios: ``--capacity-out TYPE[@ZONE]``, ``--flaky-launches N`` and
``--context KEY=VALUE``.

Before the deploy, the emulated EC2 is told which instance types have no capacity
(``emulator.capacity``: everywhere, or in one zone), and ``--context`` settings go to
``cdk deploy`` as ``-c KEY=VALUE`` (for example ``workerInstanceTypes=g6.xlarge,g4dn.xlarge``
or ``placementGroup=true``). Then AWS plays itself: a mixed instances group launches its
next type; a group with nothing left in its zone publishes launch errors, which reach the
real Lambda; for a single-zone cluster the Lambda moves both groups to the next zone, the
groups refill there, and the new instances boot (``emulator.autoscaling``), before the
demo waits for the membership as usual. The report's ``capacity`` section lists what was
out, where each node runs and on what, and every decision the Lambda logged with its cause.

``--flaky-launches N``: the first N worker launches fail with EC2's insufficient-capacity
error (``emulator.capacity``'s fault hook), then capacity frees. The Lambda leaves the
transient errors to the group's own retries (``LAUNCH_RETRY_SECONDS``), the emulated group
retries every ``emulator.capacity.RETRY_SECONDS``, and the cluster forms at full size; the
report's ``capacity.flaky`` says how many launches failed and what the Lambda decided.

A master group that cannot launch at all fails the stack's wait condition from the Lambda
itself (it signals the handle); :func:`settle` stops at that FAILURE with its reason.
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
#: Lambda log messages the report keeps (docs/capacity-adjuster.md, "Logs"), and the
#: ``decision`` lines whose ``action`` is ``retry`` (a transient error left to the group).
DECISION_MESSAGES = ("zone-decision", "group-moved", "instance-replaced", "capacity-lowered",
                     "launch-error", "setup-failed-signalled")
#: The stack's setting for the capacity adjuster's retry window, and the window the demo asks
#: for with ``--capacity-out`` (unless ``--context`` sets one): the emulated group retries
#: every few seconds, so a short window still sees several retries, and the demo does not
#: wait the default 10 minutes before the zone moves or the master's failure.
RETRY_KEY = "launchRetrySeconds"
DEMO_RETRY_SECONDS = 20
#: The worker group's role tag (the stack's ``NodeType`` tag), what --flaky-launches targets.
WORKER_TAG = "NodeType=Worker"


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
    if ns.flaky_launches:
        http_json(f"{ctx.control}/flaky-launches", "POST",
                  {"count": ns.flaky_launches, "tag": WORKER_TAG})
        ctx.info(f"the first {ns.flaky_launches} worker launch(es) fail with "
                 f"InsufficientInstanceCapacity, then capacity frees (emulator.capacity)")
    return stack_context(ns)


def stack_context(ns: argparse.Namespace) -> dict[str, str]:
    """The ``-c`` settings ``--context`` asks for (and the retry window ``--capacity-out``
    wants), as the deploy passes them."""
    pairs = [p.partition("=") for p in ns.context]
    context = {k.strip(): v.strip() for k, _sep, v in pairs}
    if ns.capacity_out:
        context.setdefault(RETRY_KEY, str(DEMO_RETRY_SECONDS))
    return context


def retry_window(ctx: DemoContext) -> float:
    """The deployed function's ``LAUNCH_RETRY_SECONDS`` (0 when it has none)."""
    value = (ctx.cluster.function_env if ctx.cluster else {}).get("LAUNCH_RETRY_SECONDS", "0")
    return float(value) if str(value).isdigit() else 0.0


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
    if not ctx.ns.capacity_out and not ctx.ns.flaky_launches:
        return
    window = retry_window(ctx)
    ctx.step(f"capacity is short: Auto Scaling's launch errors go to the Lambda, which leaves "
             f"transient ones to the group's retries (every {emulated.RETRY_SECONDS:.0f} s "
             f"here) for {window:.0f} s; the groups refill where capacity is")
    ctx.autoscaling = ctx.autoscaling or cluster.autoscaling(ctx)
    log = ctx.logs / "lambda.log"
    seen = 0
    timeout = SETTLE_TIMEOUT_S + window
    deadline = time.monotonic() + timeout
    missing = "not checked yet"
    while time.monotonic() < deadline:
        ctx.autoscaling.tick(force=True)
        lines = decisions(log)
        for rec in lines[seen:]:
            if rec["msg"] == "zone-decision" and rec.get("action") == "stay":
                continue  # no zone to move to: the report keeps it, the console need not
            ctx.info(f"[dim]lambda {rec['msg']}: {escape(_say(rec))}[/]")
        seen = len(lines)
        failure = [sig for sig in ctx.signals() if sig.get("Status") == "FAILURE"]
        if failure:  # the Lambda failed the setup: the master group cannot launch
            raise DemoError(f"the cluster's setup failed (wait condition FAILURE from "
                            f"{failure[0].get('UniqueId')}): {failure[0].get('Reason')}")
        missing = _groups_settled(ctx)
        if not missing:
            ctx.ok("groups at their desired capacity, every instance booted")
            show_placement(ctx)
            return
        time.sleep(0.3)
    raise DemoError(f"the groups did not settle within {timeout:.0f} s ({missing}); "
                    f"the Lambda's log: {log}")


def preferred_types(ctx: DemoContext) -> dict[str, str]:
    """Each group's first instance type (its mixed instances policy's first override)."""
    out: dict[str, str] = {}
    with contextlib.suppress(Exception):
        described = ctx.session().client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[g.name for g in ctx.cluster.groups.values()])
        roles = {g.name: role for role, g in ctx.cluster.groups.items()}
        for group in described["AutoScalingGroups"]:
            overrides = (group.get("MixedInstancesPolicy") or {}).get(
                "LaunchTemplate", {}).get("Overrides") or []
            if overrides:
                out[roles[group["AutoScalingGroupName"]]] = overrides[0]["InstanceType"]
    return out


def placement(ctx: DemoContext) -> list[dict]:
    """Where each live node runs and on what (EC2's DescribeInstances)."""
    live = [n for n in ctx.nodes if n.status in ("running", "stopped")]
    if not live or not ctx.control:
        return []
    with contextlib.suppress(Exception):
        res = ctx.session().client("ec2").describe_instances(
            InstanceIds=[n.instance_id for n in live])
        info = {i["InstanceId"]: i for r in res["Reservations"] for i in r["Instances"]}
        return [{"instance_id": n.instance_id, "role": n.role, "address": n.address,
                 "instance_type": info[n.instance_id]["InstanceType"],
                 "zone": info[n.instance_id]["Placement"]["AvailabilityZone"]}
                for n in live if n.instance_id in info]
    return []


def show_placement(ctx: DemoContext) -> None:
    """One console line per node: the instance type the capacity fallback chose and the
    zone, saying when it is not the group's first choice."""
    first = preferred_types(ctx)
    for n in placement(ctx):
        wanted = first.get(n["role"])
        fallback = (f" [yellow](fallback: {escape(wanted)} had no capacity)[/]"
                    if wanted and wanted != n["instance_type"] else "")
        ctx.info(f"{n['role']:6} {n['instance_id']} {n['address']:15} runs on "
                 f"{escape(n['instance_type'])} in {escape(n['zone'])}{fallback}")


def _say(rec: dict) -> str:
    if rec["msg"] == "decision":
        return f"{rec.get('asg')}: {rec.get('error_code') or 'launch error'}: {rec.get('reason')}"
    if rec["msg"] == "launch-error":
        return f"{rec.get('asg')}: {rec.get('error_code')} ({rec.get('error_kind')})"
    if rec["msg"] == "setup-failed-signalled":
        return f"wait condition FAILURE: {rec.get('reason')}"
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
                if isinstance(rec, dict) and (rec.get("msg") in DECISION_MESSAGES or (
                        rec.get("msg") == "decision" and rec.get("action") == "retry")):
                    out.append(rec)
    return out


def report(ctx: DemoContext) -> dict | None:
    """The report's ``capacity`` section (None without ``--capacity-out``/``--context``)."""
    ns = ctx.ns
    if not ns.capacity_out and not ns.context and not ns.flaky_launches:
        return None
    nodes = placement(ctx)
    recorded = launches.launch_failures(ctx.cluster_paths) if ctx.cluster else ()
    found = decisions(ctx.logs / "lambda.log")
    return {
        "flaky": flaky_report(ctx, found, nodes) if ns.flaky_launches else None,
        "out": list(ns.capacity_out),
        "context": dict(p.partition("=")[::2] for p in ns.context),
        "nodes": nodes,
        "decisions": [{k: v for k, v in rec.items() if k not in ("ts", "request_id")}
                      for rec in found],
        "launch_failures": [a.to_dict() for a in recorded],
    }


def flaky_report(ctx: DemoContext, found: list[dict], nodes: list[dict]) -> dict:
    """What ``--flaky-launches`` did: launches failed, the Lambda's decisions on them, and
    the workers that ran in the end."""
    state: dict = {}
    with contextlib.suppress(Exception):
        state = dict(http_json(f"{ctx.control}/flaky-launches", "GET"))  # type: ignore[arg-type]
    retries = [d for d in found if d.get("msg") == "decision" and d.get("action") == "retry"
               and d.get("role") == "worker"]
    # what the Lambda made of each launch error: "retry" while the group was short, a success
    # report when the group's retry had filled it before the error was delivered
    errors = [o for rec in (ctx.invoker.invocations if ctx.invoker else [])
              if rec["events"] == [emulated.LAUNCH_ERROR] for o in rec["outcomes"]]
    return {
        "asked": ctx.ns.flaky_launches,
        "failed": state.get("failed"),
        "retry_seconds_emulated": emulated.RETRY_SECONDS,
        "launch_retry_seconds": retry_window(ctx),
        "left_to_retries": len(retries),
        "error_outcomes": errors,
        "causes": sorted({str(d.get("error_code")) for d in retries}),
        "lowered": [d for d in found if d.get("msg") == "capacity-lowered"],
        "workers": len([n for n in nodes if n.get("role") == "worker"]),
        "desired": ctx.cluster.worker.desired if ctx.cluster else None,
    }

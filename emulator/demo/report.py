"""What the demo tells at the end: ``demo-report.json`` (docs/demo.md lists its fields), the
summary table, and with ``--keep`` how to use and stop the cluster left running."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.node_files import parse_env_file
from bootstrap_scripts.protocol.paths import DEEPLEARNING_DIR, NodePaths
from emulator import deploy as dp
from emulator.demo.context import BIN_DIR, STATE_FILE, DemoContext, generation_entry
from emulator.nodes import PYTHON

#: Elastic bookkeeping only the harness needs (monotonic clock readings).
INTERNAL_KEYS = ("t", "agent_started", "first_step_t")
TIMING_LABELS = {"moto_start_s": "moto start", "bootstrap_s": "cdk bootstrap",
                 "deploy_s": "cdk deploy (synth + deploy)",
                 "boot_to_membership_s": "boot to membership", "job_s": "training job",
                 "resume_job_s": "resumed job", "total_s": "whole demo"}


def node_report(ctx: DemoContext) -> list[dict]:
    """Every node with what it registered and the ``DEEPLEARNING_*`` env it exported."""
    registrations = state.read_registrations(ctx.efs)
    out = []
    for n in ctx.nodes:
        env_text = ""
        with contextlib.suppress(OSError):
            env_text = NodePaths(n.root).env.read_text()
        env = parse_env_file(env_text)
        reg = registrations.get(n.instance_id)
        out.append({"instance_id": n.instance_id, "role": n.role, "address": n.address,
                    "gpus": reg.gpus if reg else int(env.get("DEEPLEARNING_WORKER_GPU_COUNT",
                                                             0) or 0),
                    "instance_type": n.instance.instance_type, "status": n.status,
                    "rank": int(env["DEEPLEARNING_NODE_RANK"])
                    if "DEEPLEARNING_NODE_RANK" in env else None,
                    "root": str(n.root), "env": env})
    for iid in ctx.failed_launches:
        out.append({"instance_id": iid, "role": "worker", "address": "", "gpus": 0,
                    "status": "launch-failed", "rank": None, "env": {}})
    return out


def build_report(ctx: DemoContext, status: str, exit_code: int, error: str = "") -> dict:
    ns = ctx.ns
    running = [n for n in ctx.nodes if n.role == "worker" and n.status == "running"]
    main_jobs = [j for j in ctx.jobs if not j.resumed]
    first = main_jobs[0] if main_jobs else None
    last = ctx.jobs[-1] if ctx.jobs else None
    timings = {k: round(v, 2) for k, v in ctx.timings.items() if k != "boot_started"}
    timings["job_s"] = round(first.seconds, 2) if first else None
    if len(ctx.jobs) > 1:
        timings["resume_job_s"] = round(ctx.jobs[-1].seconds, 2)
    timings["total_s"] = round(time.monotonic() - ctx.t0, 2)
    c = ctx.cluster
    m = ctx.membership
    return {
        "status": status, "exit_code": exit_code, "error": error,
        "options": {"workers": ns.workers, "fail_launches": ns.fail_launches,
                    "kill_node_after": ns.kill_node_after, "epochs": ns.epochs,
                    "require_acc": ns.require_acc, "keep": ns.keep},
        "endpoint": ctx.endpoint,
        "stack": {"name": dp.STACK, "resources": c.resource_count if c else 0,
                  "cluster_id": c.cluster_id if c else "",
                  "groups": {r: {"name": g.name, "desired": g.desired, "min": g.min_size,
                                 "max": g.max_size,
                                 "instances": [i.instance_id for i in g.instances]}
                             for r, g in (c.groups.items() if c else [])},
                  "function": c.function_name if c else "",
                  "function_env": c.function_env if c else {}},
        "counts": {"workers_requested": ns.workers,
                   "worker_launches_failed": len(ctx.failed_launches),
                   "workers_launched": ns.workers - len(ctx.failed_launches),
                   "workers_running": len(running),
                   "workers_killed": sum(n.status == "killed" for n in ctx.nodes),
                   "nodes_in_membership": len(m.nodes) if m else 0},
        "nodes": node_report(ctx),
        "failed_launches": ctx.failed_launches,
        "notifications": ctx.invoker.invocations if ctx.invoker else [],
        "membership": {"generation": m.generation if m else None,
                       "nodes": [x.address for x in m.nodes] if m else [],
                       "history": ctx.generations},
        "wait_condition": ctx.signals() if ctx.control else [],
        "timings": timings,
        "world_size": first.world_size if first else 0,
        "epochs": first.epochs if first else [],
        "final_acc": last.final_acc if last else None,
        "jobs": [j.to_dict() for j in ctx.jobs],
        "kill": ctx.kill_info,
        "elastic": elastic_report(ctx) if ns.elastic else None,
        "work_dir": str(ctx.work),
        "kept": ns.keep and status == "succeeded",
    }


def published_generations(ctx: DemoContext) -> list[dict]:
    """Every generation the master published, in order."""
    gdir = ctx.cluster_paths.generations_dir
    out = []
    for f in sorted(gdir.glob("*.json"), key=lambda p: int(p.stem) if p.stem.isdigit() else 0):
        with contextlib.suppress(OSError, ValueError):
            out.append(generation_entry(Membership.load(f)))
    return out


def elastic_report(ctx: DemoContext) -> dict:
    el = ctx.elastic
    paths = ctx.cluster_paths
    sizes = [x["world_size"] for x in el["starts"]]
    distinct = [w for i, w in enumerate(sizes) if i == 0 or sizes[i - 1] != w]
    try:
        log = paths.membership_log.read_text().splitlines()
    except OSError:
        log = []
    clean = {k: {kk: vv for kk, vv in v.items() if kk not in INTERNAL_KEYS}
             for k, v in el.items() if k in ("join", "drain")}
    prepared = sorted(p.name for p in paths.prepared_dir.glob("*")
                      if p.suffix in (".ok", ".failed"))
    return {"world_sizes": distinct, "restarts": el["starts"], "membership_log": log,
            "generations": published_generations(ctx), "prepared": prepared,
            "join_latency_s": clean.get("join", {}).get("first_step_s"),
            "drain_latency_s": clean.get("drain", {}).get("continued_s"), **clean}


def summary_table(console, report: dict) -> None:
    from rich.table import Table

    t = Table(title="emulated cluster", show_lines=False)
    for col in ("instance", "role", "address", "GPUs", "rank", "status"):
        t.add_column(col)
    for n in report["nodes"]:
        t.add_row(n["instance_id"], n["role"], n["address"] or "-", str(n["gpus"]),
                  "-" if n["rank"] is None else str(n["rank"]), n["status"])
    console.print(t)
    tm = Table(title="figures")
    tm.add_column("what")
    tm.add_column("value", justify="right")
    for key, label in TIMING_LABELS.items():
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
    console.print(tm)


def keep_instructions(ctx: DemoContext) -> None:
    """``--keep``: how to reach the cluster left running, and how to stop it."""
    master = ctx.master()
    if master is None:
        return
    env = " ".join(f"{k}={v}" for k, v in ctx.aws.items())
    state_file = ctx.work / STATE_FILE
    bin_dir = master.root / BIN_DIR
    ctx.console.print("\n[bold]The emulated cluster is still running (--keep).[/]")
    ctx.console.print(
        f"  a shell with the master's environment:\n"
        f"    cd {dp.REPO_ROOT} && env {env} PYTHONPATH={dp.REPO_ROOT} "
        f"AWS_EC2_METADATA_SERVICE_ENDPOINT={master.imds_url} "
        f"bash --rcfile <(echo 'source ~/.bashrc 2>/dev/null; set -a; "
        f"source {NodePaths(master.root).env}; set +a; "
        f"PATH={bin_dir}:{Path(PYTHON).parent}:$PATH')\n"
        f"  run a job on every node:\n"
        f"    {bin_dir}/dl-run --root {master.root} -- -m "
        f"bootstrap_scripts.examples.train_digits --resume --epochs {ctx.ns.epochs + 5}\n"
        f"  cluster health:\n"
        f"    {bin_dir}/dl-health --root {master.root}\n"
        f"  node files: {ctx.work}/nodes/<instance-id>/{DEEPLEARNING_DIR}/, EFS: {ctx.efs},"
        f" logs: {ctx.logs}\n"
        f"  stop everything:\n"
        f"    {PYTHON} -m emulator.demo --stop {state_file}", highlight=False, soft_wrap=True)

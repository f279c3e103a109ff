"""What the demo tells at the end: ``demo-report.json`` (docs/demo.md lists its fields), the
summary table, and with ``--keep`` how to use and stop the cluster left running."""

from __future__ import annotations

import contextlib
import sys
import time
from decimal import Decimal
from pathlib import Path

from rich.markup import escape

from bootstrap_scripts.ops import cost
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.node_files import parse_env_file
from bootstrap_scripts.protocol.paths import DEEPLEARNING_DIR, JobPaths, ManagedPaths, NodePaths
from emulator import deploy as dp
from emulator.demo import capacity, joblog, shell
from emulator.demo.context import STATE_FILE, DemoContext, generation_entry

#: Elastic bookkeeping only the harness needs (monotonic clock readings).
INTERNAL_KEYS = ("t", "wall", "agent_started", "first_step_t")
TIMING_LABELS = {"moto_start_s": "moto start", "bootstrap_s": "cdk bootstrap",
                 "deploy_s": "cdk deploy (synth + deploy)",
                 "boot_to_membership_s": "boot to membership", "job_s": "training job",
                 "slurm_idle_s": "membership to every node idle in Slurm",
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
                    "flaky_launches": ns.flaky_launches,
                    "kill_node_after": ns.kill_node_after,
                    "kill_master_after": ns.kill_master_after,
                    "unhealthy_node": ns.unhealthy_node, "epochs": ns.epochs,
                    "require_acc": ns.require_acc, "keep": ns.keep},
        "endpoint": ctx.endpoint,
        "scheduler": getattr(ns, "scheduler", "native"),
        "slurm_job": ctx.slurm.get("job"),
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
        "jobs": [{**j.to_dict(), "cost": job_cost(ctx, j.managed_id)} for j in ctx.jobs],
        "kill": ctx.kill_info,
        "recovery": {**ctx.recovery, "kill_node": ctx.kill_info} if ctx.recovery or
        ctx.kill_info else None,
        "autoscaling": ([e.to_dict(ctx.t0) for e in ctx.autoscaling.events]
                        if ctx.autoscaling else []),
        "elastic": elastic_report(ctx) if ns.elastic else None,
        "capacity": capacity.report(ctx),
        "work_dir": str(ctx.work),
        "kept": ns.keep and status == "succeeded",
    }


def job_cost(ctx: DemoContext, managed_id: str) -> dict | None:
    """A managed job's cost ledger as the job controller recorded it (``ops/cost``: node
    seconds x the emulator's Price List prices), None for a job the controller never ran."""
    if not managed_id:
        return None
    try:
        rec = store.read_record_or_none(ManagedPaths(joblog.locate(
            ctx.cluster_paths, managed_id, managed=True)).record, ManagedJob)
    except (OSError, ValueError):
        return None
    if rec is None or not rec.usage:
        return None
    return cost.job_cost(rec.usage, time.time()).to_dict()


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
    for label, job in job_labels(report["jobs"]):
        for what, value in job_figures(job):
            tm.add_row(f"{label}: {what}", value)
    cnt = report["counts"]
    tm.add_row("workers requested / launched / running",
               f"{cnt['workers_requested']} / {cnt['workers_launched']} / "
               f"{cnt['workers_running']}")
    ran = report.get("slurm_job")
    tm.add_row("scheduler", f"Slurm: job {ran['job_id']} as {ran['user']} on "
               f"{ran['num_nodes']} nodes" if ran else report.get("scheduler", "native"))
    flaky = (report.get("capacity") or {}).get("flaky")
    if flaky:
        tm.add_row("flaky launches: failed / left to retries / workers at the end",
                   f"{flaky['failed']} / {flaky['left_to_retries']} / {flaky['workers']} of "
                   f"{flaky['desired']}")
    console.print(tm)


def job_labels(jobs: list[dict]) -> list[tuple[str, dict]]:
    """Each job with the label its figures go under: "job" alone, else "job 1 (killed)",
    "job 2 (resumed)", so figures of two jobs are never read as one."""
    if len(jobs) == 1:
        return [("job", jobs[0])]
    out = []
    for i, job in enumerate(jobs, 1):
        how = "resumed" if job["resumed"] else "first"
        if job.get("killed"):
            how += f", a node killed at {job['killed'].get('address', '?')}"
        out.append((f"job {i} ({how})", job))
    return out


def job_figures(job: dict) -> list[tuple[str, str]]:
    """One job's figures: epochs, world size, samples/s, accuracy or exit status, cost."""
    rows = []
    epochs = job["epochs"]
    if epochs:
        rows.append(("epochs", f"{epochs[0]['epoch']}..{epochs[-1]['epoch']}"))
        rows.append(("world size", str(job["world_size"])))
        sps = sorted(e["samples_per_s"] for e in epochs)
        rows.append(("samples/s (median)", str(sps[len(sps) // 2])))
    if job["final_acc"] is not None:
        rows.append(("final accuracy", f"{job['final_acc']:.3f}"))
    if job["exit_code"] != 0:
        rows.append(("exit status", str(job["exit_code"])))
    ledger = job.get("cost")
    if ledger:
        spent = ledger["usd"] if ledger["usd"] == "unknown" else cost.usd(
            Decimal(ledger["usd"]))
        rows.append(("cost", f"{spent} USD ({ledger['node_seconds'] / 3600:.3f} node-hours)"))
    return rows


def job_user() -> str:
    """Who ``dlc submit --as`` can name here: this user unless it is a system user (root)."""
    import getpass
    import os

    return getpass.getuser() if os.getuid() >= 1000 else "USER"


def keep_instructions(ctx: DemoContext) -> None:
    """``--keep``: how to reach the cluster left running, and how to stop it."""
    master = ctx.master()
    if master is None:
        return
    env = {**ctx.aws, "AWS_EC2_METADATA_SERVICE_ENDPOINT": master.imds_url}
    shell_path, env_file = shell.write_node_shell(ctx.work, "master", master.root,
                                                  master.address, env)
    state_file = record_aws(ctx)
    # dlc tunnel / dlc tensorboard run `aws ssm start-session`, which needs a Session Manager
    # plugin: the emulator's stand-in (emulator/session_plugin.py), in the kept work dir
    from emulator import session_plugin

    plugin_dir = session_plugin.install(ctx.work / "session-plugin-bin").parent
    ctx.console.print("\n[bold]The emulated cluster is still running (--keep).[/]")
    ctx.console.print(
        f"  from here, as from a laptop against AWS (dlc talks to the emulator's AWS APIs;\n"
        f"  'make setup' put the dlc command next to this Python):\n"
        f"    export PATH={Path(sys.executable).parent}:$PATH\n"
        f"    export DLC_EMULATOR={state_file}\n"
        f"    dlc status\n"
        f"    dlc submit --as {job_user()} -- python -m bootstrap_scripts.examples.train_digits\n"
        f"      (jobs never run as root: --as names a user of this machine with uid >= 1000)\n"
        f"    dlc logs -f <job id>\n"
        f"    dlc scale --status   (base, desired and maximum workers; dlc scale --workers N)\n"
        f"    PATH={plugin_dir}:$PATH dlc tensorboard <job id>   (through the emulated\n"
        f"      Session Manager; that directory holds its stand-in of AWS's plugin)\n"
        f"  (every command: docs/dlc.md)\n"
        + (f"  [bold yellow]note[/] {escape(ctx.user_access)}\n" if ctx.user_access else "") +
        f"  a shell on the master, where the README's commands work as written:\n"
        f"    {shell_path}\n"
        f"  then, for example:\n"
        f"    dl-run -- python -m bootstrap_scripts.examples.train_digits --resume "
        f"--epochs {ctx.ns.epochs + 5}\n"
        f"    dl-health\n"
        f"  (or in the shell you are in: . {env_file})\n"
        f"{slurm_lines(ctx, shell_path)}"
        f"  node files: {ctx.work}/nodes/<instance-id>/{DEEPLEARNING_DIR}/, EFS: {ctx.efs},"
        f" logs: {ctx.logs}\n"
        f"  stop everything (it lists what it deletes first; --keep-files keeps the files):\n"
        f"    {stop_command(ctx)}", highlight=False, soft_wrap=True)


def slurm_lines(ctx: DemoContext, shell_path: Path) -> str:
    """With ``--scheduler slurm``: Slurm's commands in that shell, as the demo's user."""
    user = ctx.slurm.get("user")
    if not user:
        return ""
    return (f"  Slurm's commands work in that shell as on the node (sacct: accounting is not\n"
            f"  configured yet, docs/demo.md); jobs as the demo's user {user}:\n"
            f"    runuser -u {user} -- {shell_path} sinfo\n"
            f"    cd ~{user} && runuser -u {user} -- {shell_path} sbatch "
            f"{dp.REPO_ROOT}/bootstrap_scripts/examples/train_digits.sbatch --epochs 5\n"
            f"    runuser -u {user} -- {shell_path} squeue\n")


def record_aws(ctx: DemoContext) -> Path:
    """Add the emulator's AWS settings (endpoint, region, dummy credentials) to the kept
    cluster's state file, where ``dlc --emulator STATE`` reads them; returns its path."""
    import json

    path = ctx.work / STATE_FILE
    data = json.loads(path.read_text())
    data["aws"] = {"endpoint": ctx.endpoint, "region": dp.REGION,
                   "access_key_id": ctx.aws.get("AWS_ACCESS_KEY_ID", ""),
                   "secret_access_key": ctx.aws.get("AWS_SECRET_ACCESS_KEY", ""),
                   "session_token": ctx.aws.get("AWS_SESSION_TOKEN", "")}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def stop_command(ctx: DemoContext) -> str:
    return f'make demo ARGS="--stop {ctx.work / STATE_FILE}"'


def work_contents(work: Path) -> str:
    """What is in a demo's work dir, one indented line per part (for ``--stop``)."""
    parts = {"efs/jobs": "every job's spec, per-node logs and exit records",
             "efs/checkpoints": "training checkpoints",
             "efs/cluster": "membership, registrations, node agent logs",
             "nodes": "every node's root (opt/deeplearning files, installed wrappers)",
             "logs": "the demo's logs (cdk, moto, lambda, agents, executors, dl-run)",
             "cloud": "moto's state"}
    return "\n".join(f"    {work / rel}/  {what}" for rel, what in parts.items()
                     if (work / rel).exists())


def failure_epilogue(ctx: DemoContext, error: str, *, kept: bool) -> None:
    """The last lines of a failed run: the cause in one sentence, where the full logs are,
    and what is left behind (the work dir always; the cluster with ``--keep``)."""
    cause = (error.strip().splitlines() or ["the demo failed"])[0]
    out = ctx.console
    out.print(f"\n[bold red]demo failed:[/] {escape(cause)}", highlight=False, soft_wrap=True)
    job = ctx.jobs[-1] if ctx.jobs else None
    attempt = joblog.attempt_job_id(ctx.cluster_paths, job) if job is not None else ""
    if attempt:
        out.print(f"  job logs, one per node: "
                  f"{JobPaths(joblog.locate(ctx.cluster_paths, attempt)).nodes}/"
                  f"<rank>.log", highlight=False, soft_wrap=True)
    out.print(f"  the demo's logs (cdk, lambda, node agents, dl-run): {ctx.logs}/",
              highlight=False, soft_wrap=True)
    if kept:
        out.print(f"  the cluster is still running for inspection (above); stop it: "
                  f"{stop_command(ctx)}", highlight=False, soft_wrap=True)
    elif ctx.created_work:
        out.print(f"  work dir kept: {ctx.work} (remove it: {stop_command(ctx)})",
                  highlight=False, soft_wrap=True)
    else:
        out.print(f"  work dir: {ctx.work}", highlight=False, soft_wrap=True)

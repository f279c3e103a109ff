"""Slurm's ``Prolog``: the health gate's node-local checks on this node before each job.

slurmd runs ``etc/slurm/prolog.sh`` (:func:`bootstrap_scripts.slurm.config.render_prolog`)
as root on every node of a job's allocation when the job is allocated (``PrologFlags=Alloc``),
and the batch script starts only once every node's prolog passed (``DeferBatch``). The
script ``exec``s this module with a fixed environment (``env -i``, the agent's own
interpreter with ``-I``): nothing of the job's user reaches a root process here, and nothing
of the job is read. What it reads is root's own on this node: the node's env file (its
address) and the membership it applied (its instance, role and GPUs as its agent registered
them at boot, which is also slurmd's ``Gres=gpu:N``). The job id slurmd passes is only
written in the log line, and only when it is a number.

It runs the checks ``dl-health --deep`` runs on a node (``ops.node_checks.plan``:
nvidia-smi, dcgm, efa, efs, disk), side by side, each within its budget
(``ops.gate_report.GateSettings``): the whole takes at most the longest budget
(:func:`bound`, below slurm.conf's ``PrologEpilogTimeout``), and a check stuck in the kernel
cannot keep the process alive (``os._exit``). The same verdicts as the gate's
(``gate_report.decide_*``) judge each finding, against the GPUs the node registered; EFA is
not judged here (what is attached is EC2's answer, asked by the gate on the master).

On a failure it drains its own node, ``scontrol update NodeName=<own> State=DRAIN
Reason="dl-health: <check> <value>"``, and exits 1: slurmd reports the failed prolog,
slurmctld requeues the job (``SchedulerParameters=nohold_on_prolog_fail``: not held, so it
starts on healthy nodes with no person), and the master agent, seeing the node drained with
a ``dl-health:`` reason, marks the instance Unhealthy (``slurm.node.NodeSlurm``) so Auto
Scaling replaces it. Each run leaves one line in ``var/log/slurm/dl-health-prolog.log``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.ops import gate_report as gr
from bootstrap_scripts.ops import node_checks
from bootstrap_scripts.protocol.membership import Membership, Node
from bootstrap_scripts.protocol.node_files import parse_env_file
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.protocol.store import read_text
from bootstrap_scripts.slurm import names

#: How a drain reason of the health gate starts; the master agent marks only these.
REASON_PREFIX = "dl-health:"
#: The checks judged here, in the gate's table order (no executor, no collective, no EFA).
PROLOG_CHECKS = ("gpus", "nvidia-smi", "dcgm", "efs", "disk")
LOG_NAME = "dl-health-prolog.log"
#: Longest drain reason written (Slurm keeps any length; ``sinfo -R`` shows one line).
MAX_REASON = 200
#: Seconds ``scontrol`` gets to drain the node.
SCONTROL_TIMEOUT = 10.0
#: Seconds past the longest check budget the whole prolog may take (interpreter start,
#: the drain call); slurm.conf's ``PrologEpilogTimeout`` is :func:`bound` plus more.
SLACK_SECONDS = 15.0
_UNSAFE = re.compile(r"[^\x20-\x7e]")


@dataclass(frozen=True)
class Failure:
    check: str
    value: str
    detail: str = ""


def budgets(s: gr.GateSettings) -> argparse.Namespace:
    """``node_checks``' arguments for the gate's settings ``s`` (the same budgets, probe size
    and paths as ``dl-health --deep``); ``efs`` and ``disk_path`` are set by the caller."""
    return argparse.Namespace(
        efs="", efs_mib=s.efs_mib, budget_nvidia_smi=s.budget_nvidia_smi,
        budget_dcgm=s.budget_dcgm, budget_efa=s.budget_efa, budget_efs=s.budget_efs,
        budget_disk=s.budget_disk, disk_path="", imds=False, budget_imds=s.budget_imds,
        sys_infiniband=node_checks.SYS_INFINIBAND)


def bound(s: gr.GateSettings = gr.GateSettings()) -> float:
    """Seconds the prolog takes at most: its checks run side by side, so the longest
    budget (dcgm's, after nvidia-smi's), plus :data:`SLACK_SECONDS`."""
    return max(s.node_budget(c) for c in ("nvidia-smi", "dcgm", "efa", "efs", "disk")) \
        + SLACK_SECONDS


def decide(found: Mapping[str, dict], registered_gpus: int,
           s: gr.GateSettings = gr.GateSettings()) -> list[Failure]:
    """The failures among ``found`` (``node_checks`` findings by check), judged as the gate
    judges them, against the GPUs the node registered (pure). A check with no finding
    failed its budget."""
    expected = gr.Expected(gpus=registered_gpus, gpus_source="the GPUs this node registered "
                           "(its Slurm GRES)")

    def cell(check: str) -> gr.Cell:
        source = "nvidia-smi" if check == "gpus" else check
        f = found.get(source)
        if f is None:
            return gr.timeout(s.node_budget(check))
        if check == "gpus":
            return gr.decide_gpus(f, expected, registered_gpus)
        if check == "nvidia-smi":
            return gr.decide_nvidia_smi(f, expected, registered_gpus)
        if check == "dcgm":
            return gr.decide_dcgm(f, expected, registered_gpus)
        if check == "efs":
            return gr.decide_efs(f, s.efs_floor_mbps)
        return gr.decide_disk(f, s.disk_floor_mib)

    return [Failure(c, x.value, x.detail) for c in PROLOG_CHECKS if (x := cell(c)).failed]


def drain_reason(failures: Sequence[Failure]) -> str:
    """``dl-health: <check> <value>[; <check> <value>...]``, printable ASCII, bounded."""
    text = REASON_PREFIX + " " + "; ".join(f"{f.check} {f.value}".strip() for f in failures)
    return _UNSAFE.sub("?", text)[:MAX_REASON]


def drain_args(node_name: str, reason: str) -> list[str]:
    """``scontrol``'s arguments that drain ``node_name`` (no shell: the reason is one
    argument)."""
    return ["update", f"NodeName={node_name}", "State=DRAIN", f"Reason={reason}"]


def own_node(root: Path) -> Node | None:
    """This node as the membership it applied names it (its address from its env file);
    None before it applied one."""
    paths = NodePaths(root)
    try:
        env = parse_env_file(read_text(paths.env) or "")
        m = Membership.load(paths.membership)
    except (OSError, ValueError):
        return None
    return m.node_by_address(env.get("DEEPLEARNING_NODE_ADDR", ""))


class Collect(node_checks.Runner):
    """The checks' findings kept by check (the gate's runner prints them instead)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, dict] = {}

    def report(self, line: dict) -> None:
        with self.lock:
            self.found.setdefault(line["check"], line)


def run_checks(root: Path, efs: Path, s: gr.GateSettings) -> dict[str, dict]:
    ns = budgets(s)
    ns.efs = str(efs)
    ns.disk_path = str(node_checks.local_disk_path(
        {"DEEPLEARNING_MEMBERSHIP_PATH": str(NodePaths(root).membership)}))
    r = Collect()
    for name, budget, fn in node_checks.plan(ns):
        r.start(name, budget, fn)
    r.wait()
    with r.lock:
        return dict(r.found)


def drain(root: Path, node_name: str, reason: str, scontrol: str) -> str:
    """Drain this node in Slurm; "" when done, else why not."""
    env = {"PATH": os.environ.get("PATH", ""), "SLURM_CONF": str(SlurmPaths(root).slurm_conf)}
    try:
        res = subprocess.run([scontrol, *drain_args(node_name, reason)], env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=SCONTROL_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return repr(exc)
    return "" if res.returncode == 0 else (res.stderr or res.stdout).strip()[-300:]


def log_line(root: Path, line: str) -> None:
    path = SlurmPaths(root).log_dir / LOG_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError:
        return
    with os.fdopen(fd, "a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dl-slurm-prolog", description=__doc__.split("\n")[0])
    p.add_argument("--root", default="/")
    p.add_argument("--efs", default="/efs")
    p.add_argument("--job", default="", help="the job id slurmd gave (for the log only)")
    p.add_argument("--scontrol", default="scontrol")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    root, efs = Path(ns.root), Path(ns.efs)
    job = ns.job if ns.job.isdigit() else "?"
    t0 = time.monotonic()
    me = own_node(root)
    if me is None:  # slurmd starts only with slurm.conf, which comes with a membership
        log_line(root, f"job={job} ok=skip no membership applied on this node")
        return 0
    s = gr.GateSettings()
    failures = decide(run_checks(root, efs, s), me.gpus, s)
    took = time.monotonic() - t0
    if not failures:
        log_line(root, f"job={job} ok seconds={took:.2f}")
        sys.stdout.flush()
        os._exit(0)  # a check's thread stuck in the kernel must not keep the job waiting
    reason = drain_reason(failures)
    err = drain(root, names.node_name(me.address), reason, ns.scontrol)
    log_line(root, f"job={job} FAIL seconds={took:.2f} reason={reason!r} "
             + "details=" + repr("; ".join(f"{f.check}: {f.detail}" for f in failures))
             + (f" drain-failed={err!r}" if err else ""))
    sys.stdout.flush()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())

"""``dl-health --deep``: the health gate from the command line (one table, one exit status).

Every :class:`~bootstrap_scripts.ops.gate_report.GateSettings` field is an option of its
own, derived from the dataclass so that the two cannot drift apart: ``budget_dcgm`` is
``--budget-dcgm SECONDS``, ``efs_floor_mbps`` is ``--efs-floor-mbps``, the switch
``allreduce`` is ``--no-allreduce``. ``--node ADDRESS`` (repeatable) limits the gate to
some nodes. Exit status: 0 every node passed, 1 a node failed, 2 bad usage or no membership.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from bootstrap_scripts.ops.gate import run_gate
from bootstrap_scripts.ops.gate_report import GateSettings, details, render_table, summary
from bootstrap_scripts.protocol.membership import Membership

_DEFAULTS = GateSettings()


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--deep: the health gate (docs/health.md)")
    g.add_argument("--deep", action="store_true",
                   help="run every check on the nodes themselves, each within its budget")
    g.add_argument("--node", action="append", default=[], metavar="ADDRESS",
                   help="only this node (repeatable; default: every node)")
    for f in dataclasses.fields(GateSettings):
        default = getattr(_DEFAULTS, f.name)
        if isinstance(default, bool):
            g.add_argument(f"--no-{f.name.replace('_', '-')}", dest=f"gate_{f.name}",
                           action="store_false", default=default, help=f"skip {f.name}")
        else:
            g.add_argument(f"--{f.name.replace('_', '-')}", dest=f"gate_{f.name}",
                           type=type(default), default=default,
                           metavar="SECONDS" if f.name.startswith(("budget_", "executor_"))
                           else type(default).__name__.upper(),
                           help=f"default: {default!r}" if default != "" else None)


def settings_from(args: argparse.Namespace) -> GateSettings:
    return GateSettings(**{f.name: getattr(args, f"gate_{f.name}")
                           for f in dataclasses.fields(GateSettings)})


def main(args: argparse.Namespace, m: Membership, efs: Path) -> int:
    try:
        settings = settings_from(args)
    except ValueError as exc:
        print(f"dl-health: {exc}", file=sys.stderr)
        return 2

    def progress(msg: str) -> None:
        if not args.json:
            print(f"[dl-health] {msg}", file=sys.stderr, flush=True)

    try:
        report = run_gate(Path(args.root), efs, m, addresses=args.node or None,
                          settings=settings, progress=progress)
    except ValueError as exc:
        print(f"dl-health: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(report.to_json())
    else:
        print(f"cluster {m.cluster_id or '?'}: health gate on {len(report.nodes)} node(s), "
              f"generation {m.generation}, EFS {efs}")
        sys.stdout.write(render_table(report))
        if not report.ok:
            sys.stdout.write(details(report))
        print(summary(report))
    return 0 if report.ok else 1

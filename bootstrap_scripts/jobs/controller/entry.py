"""The job controller's command line (``python -m bootstrap_scripts.jobs.controller``, the
``dl-controller.service`` unit): its options, its health gate, its signals
(``engine.service``), and the :class:`~bootstrap_scripts.jobs.controller.daemon.Controller`
it runs (what it does: that module's docstring)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bootstrap_scripts.data.checkpoint_plan import CheckpointError, parse_s3_url
from bootstrap_scripts.jobs.controller import instance_health, node_evidence, retention
from bootstrap_scripts.jobs.controller.daemon import LOG, Controller, ControllerError
from bootstrap_scripts.jobs.controller.supervise import Gate
from bootstrap_scripts.jobs.engine import service
from bootstrap_scripts.protocol.membership import Membership

DESCRIPTION = "The job controller: runs managed jobs one at a time and restarts them after faults."


def health_gate() -> Gate | None:
    """The cluster's health gate (``bootstrap_scripts.ops.gate.run_gate``) as a
    :data:`supervise.Gate`, or None when this installation has no gate module."""
    try:
        from bootstrap_scripts.ops.gate import run_gate
    except ImportError:
        return None

    def gate(root: Path, efs: Path, m: Membership, addresses: list[str]
             ) -> list[tuple[str, str, str]]:
        report = run_gate(root, efs, m, addresses=addresses)
        return [(f.address, f.instance_id, node_evidence.gate_reason(f.check,
                                                                      f.detail or f.value))
                for f in report.failures]

    return gate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dl-controller", description=DESCRIPTION)
    p.add_argument("--root", default="/", help="node root prefix (emulator: the node's dir)")
    p.add_argument("--mount-point", default="", help="EFS mount point (default: EFS_MOUNT "
                   "from the node's env file, else /efs)")
    p.add_argument("--region", default=os.environ.get("AWS_REGION", ""),
                   help="AWS region of the cluster's Auto Scaling groups")
    p.add_argument("--no-health-gate", action="store_true",
                   help="start attempts without running the health gate on their nodes")
    p.add_argument("--retention-days", type=float, default=retention.DEFAULT_RETENTION_DAYS,
                   help="move finished jobs' records to <EFS>/archive/ this many days after "
                   "they ended (default: %(default)g; 0: keep them where they are)")
    p.add_argument("--max-replacements-per-hour", type=int, help="circuit breaker: at most "
                   "this many instances marked Unhealthy in any hour (default: %(default)s)",
                   default=instance_health.DEFAULT_MAX_REPLACEMENTS_PER_HOUR)
    p.add_argument("--idle-stop-seconds", type=float, default=0.0, help="workers to zero "
                   "after this long idle (idleStopMinutes x 60; default %(default)g: never)")
    p.add_argument("--idle-stop-master-seconds", type=float, default=0.0, help="then the "
                   "master's own group to zero after this much longer idle "
                   "(idleStopMasterMinutes x 60; default %(default)g: never)")
    p.add_argument("--release-function", default="", metavar="NAME",
                   help="the capacity adjuster's function, which releases the master group "
                   "('' = the master never stops)")
    p.add_argument("--checkpoint-url", default="", metavar="s3://BUCKET/PREFIX/",
                   help="the cluster's checkpoint prefix: each managed job's checkpoint "
                   "directory is mirrored to <this><user>/<job-id>/ ('' = none)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.checkpoint_url:
        try:
            parse_s3_url(args.checkpoint_url, "--checkpoint-url")
        except CheckpointError as exc:
            p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    service.start_logging("dl-controller", verbose=args.verbose)
    efs = service.efs_mount(Path(args.root), args.mount_point)
    gate = None if args.no_health_gate else health_gate()
    if gate is None and not args.no_health_gate:
        LOG.warning("no health gate module (bootstrap_scripts.ops.gate): attempts start "
                    "without one")
    ctl = Controller(Path(args.root), efs, region=args.region, gate=gate,
                     retention_days=args.retention_days,
                     max_replacements=args.max_replacements_per_hour,
                     idle_seconds=args.idle_stop_seconds, checkpoints_url=args.checkpoint_url,
                     master_seconds=args.idle_stop_master_seconds,
                     release_function=args.release_function)
    service.stop_on_signals(ctl)
    try:
        return ctl.run()
    except ControllerError as exc:
        LOG.error("%s", exc)
        return 1


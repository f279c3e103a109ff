#!/usr/bin/env python3
"""EMR node membership: the same workers file and ``DEEPLEARNING_*`` env as the EC2 cluster.

The original template ran a metadata script on the master (YARN node list, IPs sorted as
strings) and had users copy the worker file to every node by hand. Here every node computes
the membership itself from the cluster's own instance list (``emr list-instances``: primary
first, then core nodes sorted numerically by address), with each node's GPU count from
``ec2 describe-instance-types`` (AWS's answer for the instance type, the same on every node;
never a hard-coded table), and applies it with the node agent's own
``bootstrap_scripts.agent.node_files.apply_membership``, i.e. the renderers of
``bootstrap_scripts.protocol.node_files`` that the EC2 nodes use. Every node sees the same
list, so every node writes byte-identical files; nobody copies anything.

Subcommands:
  bootstrap  the EMR bootstrap action (runs on every node, must return quickly): unpack the
             node scripts from S3, install the region file, ``dl-run`` (waits for the
             membership first), its default ``--data-checksums`` and the job executor
             (:mod:`bootstrap_scripts.emr.services`), start ``watch`` in the background;
  watch      poll the cluster; once it is RUNNING/WAITING write the membership files, and
             rewrite them whenever the instance list changes (resize, replacement);
  sync       one pass of ``watch`` (prints what it did);
  wait       block until this node's membership is written (used by the dl-run wrapper, so a
             step submitted right after the cluster comes up does not race the watcher).

Generations: every node must number the same node set the same way without talking to the
others. Each instance contributes by its state (pending 1, running 2, ended 3); states only
move forward, so the sum grows with every change and is identical on every node that sees
the same instance list.

EMR downloads this file alone and runs it with the system Python of Amazon Linux 2023 (3.9)
before the node scripts are unpacked: only the standard library is imported at module level;
the package's own modules are imported inside the functions that need them. AWS calls go
through :mod:`bootstrap_scripts.emr.aws_cli` (boto3, or the AWS CLI where boto3 is missing).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("dl-emr-metadata")

LIB_DIR = "/opt/deeplearning/lib"
JOB_FLOW_INFO = "/mnt/var/lib/info/job-flow.json"
LOG_FILE = "/var/log/dl-emr-metadata.log"
UP_STATES = ("RUNNING", "WAITING")
ENDED_STATES = ("TERMINATING", "TERMINATED", "TERMINATED_WITH_ERRORS")
PENDING_INSTANCE_STATES = ("AWAITING_FULFILLMENT", "PROVISIONING", "BOOTSTRAPPING")
GROUP_TYPES = ("MASTER", "CORE")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3


class MetadataError(RuntimeError):
    """The membership could not be built; the message says from what and why."""


# -- the membership from the instance list ----------------------------------------------------


def list_cluster_instances(emr: Any, cluster_id: str) -> list[dict]:
    """Primary and core instances (any state) as ``{instance_id, address, instance_type,
    state, group}``. ``ListInstances`` does not say which group an instance is in, so we ask
    once per group type."""
    from bootstrap_scripts.emr.aws_cli import list_all

    found: list[dict] = []
    for group in GROUP_TYPES:
        for inst in list_all(emr, "list_instances", "Instances", ClusterId=cluster_id,
                             InstanceGroupTypes=[group]):
            found.append({
                "instance_id": inst.get("Ec2InstanceId", ""),
                "address": inst.get("PrivateIpAddress", ""),
                "instance_type": inst.get("InstanceType", ""),
                "state": inst.get("Status", {}).get("State", ""),
                "group": group,
            })
    return found


def gpu_counts(ec2: Any, instance_types: list[str]) -> dict[str, int]:
    """GPUs per instance type from ``DescribeInstanceTypes`` (0 for CPU-only types)."""
    from bootstrap_scripts.emr.aws_cli import list_all

    wanted = sorted({t for t in instance_types if t})
    counts = {t: 0 for t in wanted}
    if not wanted:
        return counts
    for info in list_all(ec2, "describe_instance_types", "InstanceTypes", InstanceTypes=wanted):
        gpus = info.get("GpuInfo", {}).get("Gpus", [])
        counts[info["InstanceType"]] = sum(int(g.get("Count", 0)) for g in gpus)
    return counts


def generation_of(instances: list[dict]) -> int:
    """Same instance list -> same number on every node; any state change -> a larger one."""
    def weight(state: str) -> int:
        if state in PENDING_INSTANCE_STATES:
            return 1
        if state == "RUNNING":
            return 2
        return 3
    return max(1, sum(weight(i["state"]) for i in instances))


def build_emr_membership(cluster_id: str, instances: list[dict], gpus: dict[str, int], *,
                         efs_mount: str = "/efs", created_at: str = ""):
    """The :class:`~bootstrap_scripts.protocol.membership.Membership` of the RUNNING
    instances."""
    from bootstrap_scripts.protocol.membership import build_membership

    running = [i for i in instances if i["state"] == "RUNNING" and i["address"]]
    primaries = [i for i in running if i["group"] == "MASTER"]
    if len(primaries) != 1:
        raise MetadataError(f"cluster {cluster_id} has {len(primaries)} running primary "
                            f"instances, expected 1: {primaries!r}")

    def entry(i: dict) -> dict:
        return {"instance_id": i["instance_id"], "address": i["address"],
                "instance_type": i["instance_type"], "gpus": gpus.get(i["instance_type"], 0)}

    return build_membership(
        cluster_id=cluster_id, generation=generation_of(instances), master=entry(primaries[0]),
        workers=[entry(i) for i in running if i["group"] == "CORE"], efs_mount=efs_mount,
        created_at=created_at, reason="emr-list-instances")


def cluster_state(emr: Any, cluster_id: str) -> str:
    return emr.describe_cluster(ClusterId=cluster_id)["Cluster"]["Status"]["State"]


def sync_once(emr: Any, ec2: Any, *, cluster_id: str, instance_id: str, root: str = "/",
              efs_mount: str = "/efs") -> dict:
    """One pass: if the cluster is up, build the membership and apply it to this node."""
    from bootstrap_scripts.agent import node_files

    state = cluster_state(emr, cluster_id)
    if state not in UP_STATES:
        return {"status": "cluster-not-up", "cluster_state": state}
    instances = list_cluster_instances(emr, cluster_id)
    gpus = gpu_counts(ec2, [i["instance_type"] for i in instances])
    # No timestamp: nodes compute this independently and must write identical documents.
    m = build_emr_membership(cluster_id, instances, gpus, efs_mount=efs_mount)
    result = node_files.apply_membership(root, m, instance_id=instance_id)
    return {"status": result.status, "generation": m.generation, "changed": result.changed,
            "nodes": [n.address for n in m.nodes], "cluster_state": state}


# -- node identity ------------------------------------------------------------------------------


def read_cluster_id(info_file: str = JOB_FLOW_INFO) -> str:
    """The cluster id EMR writes on every node (``jobFlowId`` in job-flow.json)."""
    try:
        data = json.loads(Path(info_file).read_text())
    except (OSError, ValueError) as exc:
        raise MetadataError(f"cannot read the cluster id from {info_file}: {exc}; "
                            "pass --cluster-id") from None
    cluster_id = str(data.get("jobFlowId", ""))
    if not cluster_id.startswith("j-"):
        raise MetadataError(f"{info_file} has no jobFlowId (got {cluster_id!r}); "
                            "pass --cluster-id")
    return cluster_id


def own_instance_id() -> str:
    from bootstrap_scripts.agent.identity import fetch_identity

    return fetch_identity().instance_id


# -- the bootstrap action (runs as a downloaded file) -------------------------------------------


def unpack_scripts(scripts_url: str, lib_dir: str, region: str | None) -> None:
    """Fetch the node-scripts zip (the CDK asset) and unpack it as ``<lib>/bootstrap_scripts``."""
    import zipfile

    target = Path(lib_dir) / "bootstrap_scripts"
    archive = Path(lib_dir) / "node-scripts.zip"
    Path(lib_dir).mkdir(parents=True, exist_ok=True)
    cmd = ["aws", "s3", "cp", "--only-show-errors", scripts_url, str(archive)]
    if region:
        cmd += ["--region", region]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise MetadataError(f"could not download the node scripts {scripts_url}: "
                            f"{proc.stderr.strip()[:500]}")
    shutil.rmtree(target, ignore_errors=True)
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(target)


def bootstrap(args: argparse.Namespace) -> int:
    """The bootstrap action: unpack, install the wrapper and units, start them, return."""
    # Root (for /opt, /usr/local and systemd) and the DLAMI's Python (the node scripts need
    # 3.10+; Amazon Linux 2023's /usr/bin/python3 is 3.9): re-run ourselves with both.
    preferred = args.python if os.access(args.python, os.X_OK) else sys.executable
    same_python = os.path.realpath(preferred) == os.path.realpath(sys.executable)
    if not args.no_sudo and (os.geteuid() != 0 or not same_python):
        argv = [preferred, os.path.abspath(__file__), *sys.argv[1:], "--no-sudo"]
        if os.geteuid() != 0:
            os.execvp("sudo", ["sudo", "-E", *argv])
        os.execv(preferred, argv)
    unpack_scripts(args.scripts_url, args.lib_dir, args.region)
    sys.path.insert(0, args.lib_dir)
    from bootstrap_scripts.agent.install import instance_region
    from bootstrap_scripts.emr.services import install_node_services
    from bootstrap_scripts.node.node_region import RegionError

    python = sys.executable  # the preferred interpreter, after the re-run above
    watch_args = ["--root", "/", "--efs-mount", args.efs_mount]
    if args.region:
        watch_args += ["--region", args.region]
    given = {} if args.data_checksums is None else {"data_checksums": args.data_checksums}
    try:
        # the stack's region (the construct passes it); instance metadata's without it
        region = args.region or instance_region("")
        written = install_node_services(root=args.root, python=python, lib_dir=args.lib_dir,
                                        efs_mount=args.efs_mount, watch_args=watch_args,
                                        region=region, systemctl=not args.no_systemctl,
                                        **given)
    except (ValueError, RegionError) as exc:
        raise MetadataError(str(exc)) from None
    print(f"emr_metadata: installed {', '.join(str(p) for p in written)}; the membership "
          "watcher writes this node's membership files once the cluster is up", flush=True)
    return EXIT_OK


# -- watch / sync / wait --------------------------------------------------------------------------


def _context(args: argparse.Namespace) -> tuple[Any, Any, str, str]:
    from bootstrap_scripts.emr.aws_cli import make_client

    cluster_id = args.cluster_id or read_cluster_id(args.job_flow_info)
    instance_id = args.instance_id or own_instance_id()
    return (make_client("emr", args.region), make_client("ec2", args.region), cluster_id,
            instance_id)


def sync_command(args: argparse.Namespace) -> int:
    from bootstrap_scripts.emr.aws_cli import AwsCliError

    emr, ec2, cluster_id, instance_id = _context(args)
    try:
        result = sync_once(emr, ec2, cluster_id=cluster_id, instance_id=instance_id,
                           root=args.root, efs_mount=args.efs_mount)
    except AwsCliError as exc:
        raise MetadataError(str(exc)) from None
    print(json.dumps(result, sort_keys=True))
    return EXIT_OK if result["status"] in ("applied", "unchanged") else EXIT_FAILED


def watch(args: argparse.Namespace) -> int:
    emr, ec2, cluster_id, instance_id = _context(args)
    last = None
    while True:
        try:
            result = sync_once(emr, ec2, cluster_id=cluster_id, instance_id=instance_id,
                               root=args.root, efs_mount=args.efs_mount)
            key = (result["status"], result.get("generation"))
            if key != last:
                log.info("event=membership cluster=%s %s", cluster_id,
                         json.dumps(result, sort_keys=True))
                last = key
            if result.get("cluster_state") in ENDED_STATES:
                return EXIT_OK
        except Exception as exc:  # transient API errors must not kill the watcher
            log.warning("event=membership-error cluster=%s error=%r", cluster_id, exc)
        time.sleep(args.interval)


def wait(args: argparse.Namespace) -> int:
    from bootstrap_scripts.agent import node_files
    from bootstrap_scripts.emr.services import WATCH_UNIT

    deadline = time.monotonic() + args.timeout
    while node_files.applied_generation(args.root) < 1:
        if time.monotonic() >= deadline:
            print(f"emr_metadata: no membership under {args.root} after {args.timeout:.0f}s; "
                  f"see {LOG_FILE} and 'systemctl status {WATCH_UNIT}'", file=sys.stderr)
            return EXIT_TIMEOUT
        time.sleep(args.poll)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="emr_metadata", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bootstrap", help="EMR bootstrap action: install and start the watcher")
    b.add_argument("--scripts-url", required=True, help="s3:// URL of the node-scripts zip")
    b.add_argument("--region", default=None)
    b.add_argument("--efs-mount", default="/efs")
    b.add_argument("--python", default="/opt/pytorch/bin/python",
                   help="interpreter for the services (default: the DLAMI's PyTorch env; "
                        "falls back to this one)")
    b.add_argument("--lib-dir", default=LIB_DIR)
    # Checked by the installer once the scripts are unpacked (the modes and the default
    # live in bootstrap_scripts.data.checksums, not importable before that).
    b.add_argument("--data-checksums", default=None,
                   help="the cluster's default of dl-run --data-checksums (warn or "
                        "required; default: the node's own, warn)")
    b.add_argument("--root", default="/", help=argparse.SUPPRESS)  # tests: a temp dir
    b.add_argument("--no-systemctl", action="store_true", help=argparse.SUPPRESS)
    b.add_argument("--no-sudo", action="store_true", help=argparse.SUPPRESS)  # re-run done
    for name in ("watch", "sync"):
        w = sub.add_parser(name)
        w.add_argument("--cluster-id", default="", help=f"default: jobFlowId of {JOB_FLOW_INFO}")
        w.add_argument("--instance-id", default="", help="default: from instance metadata")
        w.add_argument("--job-flow-info", default=JOB_FLOW_INFO, help=argparse.SUPPRESS)
        w.add_argument("--region", default=None)
        w.add_argument("--root", default="/", help="node root prefix (tests: a temp dir)")
        w.add_argument("--efs-mount", default="/efs")
        w.add_argument("--interval", type=float, default=30.0)
    w = sub.add_parser("wait", help="block until this node's membership is written")
    w.add_argument("--root", default="/")
    w.add_argument("--timeout", type=float, default=1800.0)
    w.add_argument("--poll", type=float, default=5.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s dl-emr-metadata %(levelname)s %(message)s")
    handlers = {"bootstrap": bootstrap, "watch": watch, "sync": sync_command, "wait": wait}
    try:
        return handlers[args.command](args)
    except MetadataError as exc:
        print(f"emr_metadata: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    if __package__ in (None, ""):
        # Run as a downloaded file (the bootstrap action): find the unpacked package later.
        sys.path.insert(0, LIB_DIR)
    sys.exit(main())

"""dl-scale: add and remove workers of a running cluster (docs/elastic.md).

    dl-scale --workers N              set the worker group's desired capacity to N
    dl-scale --remove ADDRESS|ID      remove one elastic worker (it is drained first)
    dl-scale --replace ADDRESS|ID     replace one worker by a new instance (drained first)
    dl-scale --status                 nodes, base/elastic, generation, joins and drains

Scale-out brings up nodes that prepare, register and join the running job; scale-in and
``--remove`` go through the worker group, whose ``drain`` lifecycle hook gives the leaving
node's job shares time to stop while the others re-rendezvous (docs/protocol.md, section 7).

The master and the base workers are protected from scale-in and refused here, with the
reason: removing the master stops every job (it hosts the rendezvous), and the base workers
are the capacity the cluster was deployed with. ``--workers`` below the base count or above
the group's maximum is refused naming both values.

``--replace`` is for a worker that is slow or suspect but passes every check (a straggler
``dl-jobs`` names, a GPU throwing XID errors): its instance is marked Unhealthy, the way the
job controller marks a failed node, so Auto Scaling terminates it (through the same drain
hook) and launches a new one into the group, base workers included (health replacement is
not scale-in: the group keeps its size). The master is refused: it hosts every job's
rendezvous and the cluster's control. An operator's deliberate act, it does not count against
the job controller's ``maxReplacementsPerHour``.

On the master, ``--status`` believes a node's registration only with that node's signature
(``ops.node_records``): an instance only a registration not its own names is not listed, and
one whose key the master never learnt is shown "waiting for its node key". On a worker (no key
book) it says that the registrations it shows are unchecked.

Reads the cluster from the membership this node applied (``NodePaths.membership``, never the
unchecked copy on EFS; ``--root`` prefixes it, for the emulator) and the shared file system;
talks to Auto Scaling with the node's role (``AWS_ENDPOINT_URL`` is honoured by boto3). Exit
status: 0 done, 1 refused or failed, 64 bad usage.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.agent import discovery as disco
from bootstrap_scripts.node import node_region
from bootstrap_scripts.ops import node_records as nrec
from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.membership import Membership, MembershipError, Node
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.records import Registration

EXIT_REFUSED = 1
EXIT_USAGE = 64


class Refused(Exception):
    """The request is not allowed; the message says why and names the values."""


@dataclass
class Cluster:
    """What dl-scale knows about the cluster it runs in."""

    membership: Membership
    efs: Path
    worker_group: dict
    #: the node root prefix (where the master's key book is: ``ops.node_records``)
    root: str = "/"

    @property
    def cluster_id(self) -> str:
        return self.membership.cluster_id

    @property
    def group_name(self) -> str:
        return self.worker_group["AutoScalingGroupName"]

    @property
    def base_workers(self) -> list[Node]:
        return [n for n in self.membership.nodes[1:] if n.base]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dl-scale", description=__doc__.split("\n\n")[0])
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--workers", type=int, metavar="N",
                        help="set the number of workers (base count .. group maximum)")
    action.add_argument("--remove", metavar="ADDRESS|INSTANCE_ID",
                        help="remove one elastic worker (drained first)")
    action.add_argument("--replace", metavar="ADDRESS|INSTANCE_ID",
                        help="replace one worker by a new instance (drained first)")
    action.add_argument("--status", action="store_true", help="print the cluster's nodes")
    p.add_argument("--root", default=os.environ.get("DL_ROOT", "/"),
                   help="node root prefix (default: $DL_ROOT or /; emulator/tests)")
    p.add_argument("--mount-point", default="",
                   help="shared file system (default: the membership's efs_mount)")
    p.add_argument("--region", default=None,
                   help="AWS region (default: the environment's, else this instance's)")
    return p


def load_cluster(root: str, mount_point: str, autoscaling) -> Cluster:
    path = NodePaths(root).membership
    try:
        local = Membership.load(path)
    except FileNotFoundError:
        raise Refused(f"{path} does not exist: run dl-scale on a cluster node whose agent "
                      "has joined (or give --root)") from None
    except (OSError, MembershipError) as exc:
        raise Refused(f"cannot read {path}: {exc}") from None
    efs = Path(mount_point or local.efs_mount)
    # Only this node's applied copy names nodes here: the agent applied it once its
    # signature held (the master's own on the master), while root on any worker can write
    # the shared copy on EFS (a forged one mapping an address to another instance would
    # have --replace mark a healthy worker). On a worker it may lag by a heartbeat.
    group = disco.find_group(autoscaling, local.cluster_id, "worker")
    if group is None:
        raise Refused(f"cluster {local.cluster_id!r} has no worker group tagged "
                      f"{disco.CLUSTER_TAG_KEY}={local.cluster_id}, "
                      f"{disco.ROLE_TAG_KEY}=Worker")
    return Cluster(local, efs, group, root)


#: Where a refused ``--workers`` points: the command that shows every bound at once.
BOUNDS_HINT = "dl-scale --status shows the base, minimum, maximum and desired counts"


def set_workers(cluster: Cluster, count: int, autoscaling) -> str:
    base = len(cluster.base_workers)
    maximum = int(cluster.worker_group["MaxSize"])
    minimum = int(cluster.worker_group["MinSize"])
    if count < base:
        raise Refused(f"--workers {count} is below the {base} base worker(s) of cluster "
                      f"{cluster.cluster_id}: base workers are protected from scale-in "
                      f"(they are the capacity the cluster was deployed with); use {base} "
                      f"or more ({BOUNDS_HINT})")
    if count < minimum:
        raise Refused(f"--workers {count} is below the worker group's minimum {minimum} "
                      f"({BOUNDS_HINT})")
    if count > maximum:
        raise Refused(f"--workers {count} is above the worker group's maximum {maximum} "
                      f"(stack setting maxWorkers); redeploy with -c maxWorkers={count} "
                      f"to allow more ({BOUNDS_HINT})")
    before = int(cluster.worker_group["DesiredCapacity"])
    autoscaling.set_desired_capacity(AutoScalingGroupName=cluster.group_name,
                                     DesiredCapacity=count, HonorCooldown=False)
    if count > before:
        return (f"workers {before} -> {count}: {count - before} node(s) launching; each joins "
                "once registered (and prepared) - watch with dl-scale --status")
    if count < before:
        return (f"workers {before} -> {count}: Auto Scaling picks {before - count} unprotected "
                "worker(s); each is drained before it terminates")
    return f"workers already {count}: nothing to do"


#: SetInstanceProtection takes at most this many instances per call.
PROTECTION_BATCH = 50


def stop_all_workers(cluster: Cluster, autoscaling) -> tuple[int, int]:
    """The job controller's idle stop: every worker leaves, base workers too, each drained
    by the group's hook like any scale-in. Scale-in protection is lifted first (Auto
    Scaling never picks a protected instance for scale-in; the master agent protects the
    on-demand workers that join after a resume again), then the group's minimum and desired
    capacity go to 0 in one UpdateAutoScalingGroup (SetDesiredCapacity refuses a value
    below the minimum). Returns the (desired, minimum) it had: what a resume restores."""
    g = cluster.worker_group
    desired, minimum = int(g["DesiredCapacity"]), int(g["MinSize"])
    protected = sorted(iid for iid, i in _group_instances(cluster).items()
                       if i.get("ProtectedFromScaleIn"))
    for k in range(0, len(protected), PROTECTION_BATCH):
        autoscaling.set_instance_protection(
            AutoScalingGroupName=cluster.group_name, ProtectedFromScaleIn=False,
            InstanceIds=protected[k:k + PROTECTION_BATCH])
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=cluster.group_name,
                                          MinSize=0, DesiredCapacity=0)
    return desired, minimum


def restore_workers(cluster: Cluster, autoscaling, *, desired: int, minimum: int) -> int:
    """Undo :func:`stop_all_workers`: the size before the stop (or the group's current one
    if someone grew it since), within the group's maximum; returns the new desired
    capacity. The nodes launch, register and join as in a scale-out."""
    g = cluster.worker_group
    target = min(max(desired, int(g["DesiredCapacity"])), int(g["MaxSize"]))
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=cluster.group_name,
                                          MinSize=min(minimum, target), DesiredCapacity=target)
    return target


def _group_instances(cluster: Cluster) -> dict[str, dict]:
    return {i["InstanceId"]: i for i in cluster.worker_group.get("Instances", [])}


def resolve(cluster: Cluster, target: str, ec2=None) -> tuple[str, Node | None]:
    """(instance id, membership node or None) for an address or an instance id."""
    m = cluster.membership
    try:
        address = str(ipaddress.ip_address(target))
    except ValueError:
        return target, m.node_by_instance(target)
    node = m.node_by_address(address)
    if node is not None:
        return node.instance_id, node
    # Not a member (yet): look among the group's instances by private address.
    ids = list(_group_instances(cluster))
    if ec2 is not None and ids:
        for iid, inst in disco.describe_addresses(ec2, ids).items():
            if inst.address == address:
                return iid, None
    raise Refused(f"no node of cluster {cluster.cluster_id} has address {address}")


def remove(cluster: Cluster, target: str, autoscaling, ec2=None) -> str:
    iid, node = resolve(cluster, target, ec2)
    name = f"{target}" if target == iid else f"{target} ({iid})"
    if iid == cluster.membership.master.instance_id or (node is not None
                                                        and node.role == "master"):
        raise Refused(f"{name} is the master of cluster {cluster.cluster_id}: it hosts the "
                      "rendezvous and rank 0, so removing it would stop every job; the master "
                      "is protected from scale-in and dl-scale never removes it")
    if node is not None and node.base:
        raise Refused(f"{name} is a base worker of cluster {cluster.cluster_id} (one of the "
                      f"{len(cluster.base_workers)} it was deployed with) and is protected "
                      "from scale-in; remove an elastic worker instead (dl-scale --status "
                      "lists them)")
    instances = _group_instances(cluster)
    if iid not in instances:
        raise Refused(f"{name} is not in the worker group {cluster.group_name} (started by "
                      "hand?): terminate it with 'aws ec2 terminate-instances' after its job "
                      "shares stopped; dl-scale only removes group members, which are "
                      "drained first")
    if instances[iid].get("ProtectedFromScaleIn"):
        raise Refused(f"{name} is protected from scale-in (a base worker): dl-scale does "
                      "not remove it")
    if int(cluster.worker_group["DesiredCapacity"]) - 1 < int(cluster.worker_group["MinSize"]):
        raise Refused(f"removing {name} would take the worker group below its minimum "
                      f"{cluster.worker_group['MinSize']}")
    autoscaling.terminate_instance_in_auto_scaling_group(
        InstanceId=iid, ShouldDecrementDesiredCapacity=True)
    return (f"removing {name}: the group's drain hook stops its job shares, the others "
            "continue without it, then it terminates")


def replace(cluster: Cluster, target: str, autoscaling, ec2=None) -> str:
    """Mark a worker's instance Unhealthy: Auto Scaling drains it, terminates it and launches
    a replacement (module doc); the master and instances outside the group are refused."""
    iid, node = resolve(cluster, target, ec2)
    name = f"{target}" if target == iid else f"{target} ({iid})"
    if iid == cluster.membership.master.instance_id or (node is not None
                                                        and node.role == "master"):
        raise Refused(f"{name} is the master of cluster {cluster.cluster_id}: it hosts every "
                      "job's rendezvous and the cluster's control; dl-scale never replaces it")
    if iid not in _group_instances(cluster):
        raise Refused(f"{name} is not in the worker group {cluster.group_name}: dl-scale "
                      "only replaces group members")
    autoscaling.set_instance_health(InstanceId=iid, HealthStatus="Unhealthy",
                                    ShouldRespectGracePeriod=False)
    return (f"replacing {name}: marked Unhealthy; the group's drain hook stops its job "
            "shares, Auto Scaling terminates it and launches a new worker, which joins once "
            "it passed the health gate")


def status(cluster: Cluster, records: nrec.NodeRecords | None = None) -> str:
    """The table of ``--status``: members, then the group's other instances and the
    (believed) registered outsiders."""
    m = cluster.membership
    records = records or nrec.NodeRecords(cluster.root, cluster.efs)
    reads = records.registrations()
    registrations = {iid: r.record for iid, r in reads.items()
                     if r.believed and r.record is not None}
    group = _group_instances(cluster)
    g = cluster.worker_group
    lines = [f"cluster {cluster.cluster_id}  generation {m.generation}  workers desired "
             f"{g['DesiredCapacity']} (min {g['MinSize']}, max {g['MaxSize']}, base "
             f"{len(cluster.base_workers)})",
             f"{'ROLE':<7} {'KIND':<8} {'ADDRESS':<16} {'INSTANCE':<20} {'GEN':>4}  STATE"]
    listed = set()
    for n in m.nodes:
        listed.add(n.instance_id)
        reg = registrations.get(n.instance_id)
        kind = "base" if n.base else "elastic"
        where = "draining" if _draining(cluster.efs, n.instance_id) else "member"
        lines.append(_row(n.role, kind, n.address, n.instance_id, _applied(reg),
                          where + _not_believed(reads.get(n.instance_id))))
    # Only the group (AWS) and registrations their nodes signed name an instance here.
    for iid in sorted(set(group) | set(registrations)):
        if iid in listed:
            continue
        reg = registrations.get(iid)
        if reg is not None and reg.role != "worker":
            continue
        read = reads.get(iid)
        where = (nrec.WAITING_FOR_KEY if read is not None and reg is None
                 and read.verdict == nrec.WAITING_FOR_KEY
                 else _outsider_state(cluster, iid, reg) + _not_believed(read))
        lines.append(_row("worker", "elastic", reg.address if reg else "-", iid, _applied(reg),
                          where))
    if not records.checked:
        lines.append(nrec.UNCHECKED_HERE)
    return "\n".join(lines)


def _not_believed(read: nrec.NodeRead | None) -> str:
    """`` (registration <why>)`` for a registration on EFS the master does not believe."""
    return "" if read is None or read.believed else f" (registration {read.verdict})"


def _row(role: str, kind: str, address: str, iid: str, gen: object, where: str) -> str:
    return f"{role:<7} {kind:<8} {address:<16} {iid:<20} {gen!s:>4}  {where}"


def _applied(reg: Registration | None) -> object:
    return reg.generation_applied if reg is not None else "-"


def _draining(efs: Path, iid: str) -> bool:
    record = state.read_drain(efs, iid)
    return record is not None and not record.completed


def _outsider_state(cluster: Cluster, iid: str, reg: Registration | None) -> str:
    drain = state.read_drain(cluster.efs, iid)
    if drain is not None:
        return "draining" if not drain.completed else "drained"
    prep = state.prep_status(cluster.efs, iid)
    if prep == "failed":
        return "data-prep-failed (never joins)"
    if reg is None:
        return "launching"
    if prep is None and iid in _group_instances(cluster):
        return "joining (registered; preparing or waiting for the master)"
    return "joining"


def main(argv: list[str] | None = None) -> int:
    try:
        ns = build_parser().parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else 0
    import boto3  # only when actually talking to AWS

    # boto3 never takes the region from instance metadata: the installer's file has it
    session = boto3.session.Session(region_name=ns.region or node_region.adopt(ns.root) or None)
    autoscaling = session.client("autoscaling")
    try:
        cluster = load_cluster(ns.root, ns.mount_point, autoscaling)
        if ns.status:
            print(status(cluster))
        elif ns.workers is not None:
            print(f"dl-scale: {set_workers(cluster, ns.workers, autoscaling)}")
        elif ns.replace is not None:
            print(f"dl-scale: {replace(cluster, ns.replace, autoscaling, session.client('ec2'))}")
        else:
            print(f"dl-scale: {remove(cluster, ns.remove, autoscaling, session.client('ec2'))}")
    except Refused as exc:
        print(f"dl-scale: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as exc:  # AWS errors: say what failed, not a traceback
        print(f"dl-scale: failed: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())

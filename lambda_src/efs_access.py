"""An existing EFS that admits no NFS from the cluster's nodes, refused before any node boots:
a custom resource's Create.

Why it exists: with ``efsFileSystemId`` the file system's mount targets carry security
groups the stack does not own. When none of them admits TCP 2049 from a node, every node's
mount times out, the master signals FAILURE after its 300 s wait, and the rollback deletes
what the user had attached (https://docs.aws.amazon.com/efs/latest/ug/network-access.html:
the mount target's groups must allow inbound NFS from the clients). The stack's
``Custom::EfsAccessCheck`` is created before both groups; its Create reads, for each zone
the nodes may be in, that zone's mount target (a client mounts the one in its own zone)
and its groups' inbound rules, and answers FAILED naming each zone without a mount target
or whose mount target admits no NFS from the nodes, with the command that adds what is
missing. The deploy fails in seconds.

A rule admits the nodes when it allows TCP 2049 (or all traffic) from the nodes' security
group, or from CIDR blocks that contain the nodes' subnet in that zone. On a first deploy
the nodes' group does not exist before the stack, so only a CIDR rule (or a group of the
user's own that one names) can admit them; the stack's ``MountTargetAccess`` group, which
names the nodes' group, serves once attached. The decision is :func:`problems` (pure).
Update checks again; Delete does nothing.

Properties: ``FileSystemId``, ``NodeSecurityGroupId``, ``SubnetIds`` (the nodes' subnets,
every zone they may use). Permissions (granted to the capacity adjuster's role, which
answers): ``elasticfilesystem:DescribeMountTargets`` and
``elasticfilesystem:DescribeMountTargetSecurityGroups`` on the file system,
``ec2:DescribeSubnets`` and ``ec2:DescribeSecurityGroups`` (no resource-level permissions).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

try:  # imported as lambda_src.efs_access (tests, installed package)
    from . import cfn_response
except ImportError:  # imported as efs_access (Lambda: the asset root is on sys.path)
    import cfn_response  # type: ignore[no-redef]

RESOURCE_TYPE = "Custom::EfsAccessCheck"
NFS_PORT = 2049


@dataclass(frozen=True)
class NodeSubnet:
    """A subnet the nodes may launch in."""

    subnet_id: str
    zone: str
    cidr: str


@dataclass(frozen=True)
class MountTarget:
    """A mount target and its security groups (each as DescribeSecurityGroups answers)."""

    mount_target_id: str
    zone: str
    groups: tuple[dict[str, Any], ...]


def _allows_nfs(permission: dict[str, Any]) -> bool:
    protocol = str(permission.get("IpProtocol", ""))
    if protocol == "-1":
        return True
    if protocol not in ("tcp", "6"):
        return False
    return int(permission.get("FromPort", 0)) <= NFS_PORT <= int(permission.get("ToPort", -1))


def admits(group: dict[str, Any], node_group: str, cidr: str) -> bool:
    """``group`` lets NFS in from the nodes' group or from a block containing ``cidr``."""
    subnet = ipaddress.ip_network(cidr)
    for permission in group.get("IpPermissions") or []:
        if not _allows_nfs(permission):
            continue
        if any(p.get("GroupId") == node_group for p in permission.get("UserIdGroupPairs") or []):
            return True
        for block in permission.get("IpRanges") or []:
            source = ipaddress.ip_network(str(block.get("CidrIp", "")), strict=False)
            if subnet.version == source.version and subnet.subnet_of(source):  # type: ignore[arg-type]
                return True
    return False


def problems(file_system_id: str, targets: list[MountTarget], node_group: str,
             subnets: list[NodeSubnet]) -> list[str]:
    """What stops the nodes of each zone from mounting ``file_system_id``, with the command
    that fixes it (empty: every zone's nodes can mount it)."""
    by_zone = {t.zone: t for t in targets}
    out = []
    for subnet in subnets:
        target = by_zone.get(subnet.zone)
        if target is None:
            out.append(f"{subnet.zone}: {file_system_id} has no mount target there (the nodes "
                       f"of {subnet.subnet_id} mount the one in their own zone): aws efs "
                       f"create-mount-target --file-system-id {file_system_id} --subnet-id "
                       f"{subnet.subnet_id} --security-groups <a group admitting TCP "
                       f"{NFS_PORT} from {subnet.cidr}>")
            continue
        if any(admits(g, node_group, subnet.cidr) for g in target.groups):
            continue
        group = target.groups[0]["GroupId"] if target.groups else "<its security group>"
        out.append(f"{subnet.zone}: mount target {target.mount_target_id} of {file_system_id} "
                   f"admits no NFS from the nodes ({subnet.subnet_id}, {subnet.cidr}; security "
                   f"group {node_group}): aws ec2 authorize-security-group-ingress --group-id "
                   f"{group} --protocol tcp --port {NFS_PORT} --cidr {subnet.cidr}")
    return out


def _properties(event: dict[str, Any]) -> tuple[str, str, list[str]]:
    props = event.get("ResourceProperties") or {}
    fs, group, subnets = props.get("FileSystemId"), props.get("NodeSecurityGroupId"), \
        props.get("SubnetIds")
    if not (isinstance(fs, str) and fs.startswith("fs-") and isinstance(group, str)
            and group.startswith("sg-") and isinstance(subnets, list) and subnets
            and all(isinstance(s, str) and s.startswith("subnet-") for s in subnets)):
        raise ValueError("ResourceProperties needs FileSystemId (fs-), NodeSecurityGroupId "
                         f"(sg-) and SubnetIds (subnet-, a list), got {props!r}")
    return fs, group, subnets


def read(efs: Any, ec2: Any, file_system_id: str,
         subnet_ids: list[str]) -> tuple[list[MountTarget], list[NodeSubnet]]:
    """The mount targets with their groups, and the nodes' subnets, as AWS describes them."""
    subnets = [NodeSubnet(s["SubnetId"], s["AvailabilityZone"], s["CidrBlock"])
               for s in ec2.describe_subnets(SubnetIds=subnet_ids)["Subnets"]]
    targets = []
    for target in efs.describe_mount_targets(FileSystemId=file_system_id)["MountTargets"]:
        ids = efs.describe_mount_target_security_groups(
            MountTargetId=target["MountTargetId"])["SecurityGroups"]
        groups = ec2.describe_security_groups(GroupIds=ids)["SecurityGroups"] if ids else []
        targets.append(MountTarget(target["MountTargetId"],
                                   str(target.get("AvailabilityZoneName", "")), tuple(groups)))
    return targets, subnets


def respond(event: dict[str, Any], efs: Any, ec2: Any) -> dict[str, Any]:
    """The response object for one request; never raises."""
    kind = event.get("RequestType")
    if kind == "Delete":
        return cfn_response.body(event)
    try:
        fs, node_group, subnet_ids = _properties(event)
        targets, subnets = read(efs, ec2, fs, subnet_ids)
        found = problems(fs, targets, node_group, subnets)
    except Exception as exc:
        return cfn_response.body(event, "FAILED",
                                 f"{RESOURCE_TYPE}: {type(exc).__name__}: {exc}")
    if found:
        return cfn_response.body(event, "FAILED", "the cluster's nodes could not mount the "
                                 "existing EFS (efsFileSystemId): " + " | ".join(found))
    return cfn_response.body(event, reason=f"{fs} admits NFS from the nodes in every zone")

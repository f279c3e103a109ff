"""What EC2 says a node should have: its instance type's GPUs, and whether it was given EFA.

The health gate never trusts a hand-typed table (the original template's list made newer
types report 0 GPUs). The GPU count of a type is the sum of ``GpuInfo.Gpus[].Count`` that
EC2's DescribeInstanceTypes returns for it; a type without ``GpuInfo`` has none. A type's
hardware never changes, so the answer is cached on EFS
(``cluster/instance-types/<type>.json``, an :class:`InstanceTypeFacts` record) and EC2 is
asked once per type for the life of the cluster, by the master only.

EFA: a node is expected to show an EFA device when its instance has a network interface of
type ``efa`` or ``efa-only`` (DescribeInstances, ``NetworkInterfaces[].InterfaceType``): that
is what the launch template asked for. Only instances whose type supports EFA
(``NetworkInfo.EfaSupported``) are looked up; on any other type no EFA can be attached.

AWS: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypes.html and
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceNetworkInterface.html
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bootstrap_scripts.node import node_region
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import InstanceTypeFacts

#: DescribeInstanceTypes accepts at most this many names per call.
MAX_TYPES_PER_CALL = 100
#: Interface types that carry an EFA device.
EFA_INTERFACE_TYPES = ("efa", "efa-only")


class LookupFailed(RuntimeError):
    """EC2 could not say; the message names the call and the types or instances."""


def facts_from_info(info: Mapping[str, Any], now: float | None = None) -> InstanceTypeFacts:
    """One DescribeInstanceTypes entry as the record the gate caches (pure)."""
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    return InstanceTypeFacts(
        instance_type=str(info["InstanceType"]),
        gpus=sum(int(g.get("Count", 0)) for g in gpus),
        gpu_name=", ".join(sorted({str(g.get("Name", "")) for g in gpus} - {""})),
        efa_supported=bool((info.get("NetworkInfo") or {}).get("EfaSupported", False)),
        fetched_at=time.time() if now is None else now,
    )


def efa_interfaces(instance: Mapping[str, Any]) -> int:
    """EFA interfaces of one DescribeInstances instance (pure)."""
    return sum(1 for ni in instance.get("NetworkInterfaces") or []
               if ni.get("InterfaceType") in EFA_INTERFACE_TYPES)


def read_cached(efs: Path, name: str) -> InstanceTypeFacts | None:
    try:
        return store.read_record_or_none(ClusterPaths(efs).instance_type(name), InstanceTypeFacts)
    except ProtocolError:
        return None


def write_cached(efs: Path, facts: InstanceTypeFacts) -> None:
    """Best effort: a user without write access to ``cluster/`` just asks EC2 next time."""
    with contextlib.suppress(OSError):
        path = ClusterPaths(efs).instance_type(facts.instance_type)
        path.parent.mkdir(parents=True, exist_ok=True)
        store.write_record(path, facts)


def ec2_client(region: str | None = None) -> Any:
    """The node role's EC2 client. The region: ``region``, else the caller's configuration,
    else the one the installer took from instance metadata (boto3 never asks IMDS for it)."""
    import boto3  # only the master asks EC2; nodes running checks never import boto3

    return boto3.session.Session(region_name=region or node_region.client_region()).client(
        "ec2")


def describe(ec2: Any, names: list[str]) -> dict[str, InstanceTypeFacts | str]:
    """DescribeInstanceTypes for ``names``: facts per type, or the error text for a type EC2
    does not know (a call naming one unknown type fails whole, so those are retried alone)."""
    out: dict[str, InstanceTypeFacts | str] = {}
    for i in range(0, len(names), MAX_TYPES_PER_CALL):
        chunk = names[i:i + MAX_TYPES_PER_CALL]
        try:
            infos = _describe_all(ec2, chunk)
        except Exception as exc:  # botocore's errors, named in the message
            if len(chunk) == 1:
                out[chunk[0]] = f"DescribeInstanceTypes({chunk[0]}) failed: {exc}"
                continue
            for name in chunk:
                out.update(describe(ec2, [name]))
            continue
        for info in infos:
            facts = facts_from_info(info)
            out[facts.instance_type] = facts
        for name in chunk:
            out.setdefault(name, f"DescribeInstanceTypes did not return {name}")
    return out


def _describe_all(ec2: Any, names: list[str]) -> list[dict]:
    infos: list[dict] = []
    kwargs: dict[str, Any] = {"InstanceTypes": names}
    while True:
        page = ec2.describe_instance_types(**kwargs)
        infos += page.get("InstanceTypes", [])
        token = page.get("NextToken")
        if not token:
            return infos
        kwargs["NextToken"] = token


def instance_type_facts(efs: Path, names: Iterable[str], *, ec2: Any = None,
                        ) -> dict[str, InstanceTypeFacts | str]:
    """Facts for every named type: from the EFS cache, else from EC2 (then cached). A type
    EC2 could not describe maps to the error text; ``ec2`` None = the node role's client."""
    wanted = sorted({n for n in names if n})
    out: dict[str, InstanceTypeFacts | str] = {}
    missing = []
    for name in wanted:
        cached = read_cached(efs, name)
        if cached is not None and cached.instance_type == name:
            out[name] = cached
        else:
            missing.append(name)
    if missing:
        try:
            client = ec2 if ec2 is not None else ec2_client()
        except Exception as exc:  # no boto3, no region: said per type
            return {**out, **{n: f"no EC2 client: {exc}" for n in missing}}
        for name, result in describe(client, missing).items():
            out[name] = result
            if isinstance(result, InstanceTypeFacts):
                write_cached(efs, result)
    return out


def efa_attachments(instance_ids: Iterable[str], *, ec2: Any = None) -> dict[str, int]:
    """EFA interfaces per instance id (DescribeInstances). LookupFailed names the ids."""
    ids = sorted(set(instance_ids))
    if not ids:
        return {}
    try:
        client = ec2 if ec2 is not None else ec2_client()
        out: dict[str, int] = {}
        kwargs: dict[str, Any] = {"InstanceIds": ids}
        while True:
            page = client.describe_instances(**kwargs)
            for reservation in page.get("Reservations", []):
                for inst in reservation.get("Instances", []):
                    out[inst["InstanceId"]] = efa_interfaces(inst)
            if not page.get("NextToken"):
                return out
            kwargs["NextToken"] = page["NextToken"]
    except Exception as exc:  # botocore's errors, named in the message
        raise LookupFailed(f"DescribeInstances({', '.join(ids)}) failed: {exc}") from None

"""Cluster membership: the one data structure every node, the runner and EMR agree on.

The master agent builds a :class:`Membership` and publishes it on the shared file system
(:mod:`bootstrap_scripts.protocol.state`); every node renders the SAME files from it
(:mod:`bootstrap_scripts.protocol.node_files`). A higher ``generation`` always wins.

Plain Python only: this module runs on nodes (no CDK, no boto3 imports).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

from bootstrap_scripts.protocol import bounds, record_base, store
from bootstrap_scripts.protocol.errors import ProtocolError

SCHEMA_VERSION = 1
MASTER_ALIAS = "deeplearning-master"
ALIAS_PREFIX = "deeplearning-worker"


def alias_for(rank: int) -> str:
    """The ``/etc/hosts`` alias of the node with ``rank``: numbered from 1, master included.

    The original named every node ``deeplearning-worker1`` .. ``deeplearning-worker<N>``
    (N = ``DEEPLEARNING_WORKERS_COUNT``, the master being ``deeplearning-worker1``), and
    users' scripts loop ``for i in $(seq 1 $DEEPLEARNING_WORKERS_COUNT)`` over exactly those
    names; rank 0 is therefore ``deeplearning-worker1``.
    """
    return f"{ALIAS_PREFIX}{rank + 1}"


class MembershipError(ProtocolError):
    """A membership document is malformed; the message names the offending field/value."""


@dataclass(frozen=True)
class Node:
    """One cluster node as every other node sees it."""

    rank: int
    role: str  # "master" | "worker"
    instance_id: str
    address: str
    alias: str
    gpus: int = 0
    instance_type: str = ""
    #: Base nodes (the master and the first ``workerCount`` workers) are protected from
    #: scale-in; elastic ones come and go (docs/elastic.md). Old documents: every node base.
    base: bool = True

    @property
    def slots(self) -> int:
        """Processes this node runs: one per GPU, or one on a CPU-only node."""
        return max(1, self.gpus)


_NODE_FIELDS = tuple(f.name for f in fields(Node))


@dataclass(frozen=True)
class Membership:
    """A versioned view of the cluster. A higher ``generation`` always wins."""

    cluster_id: str
    generation: int
    nodes: tuple[Node, ...]
    efs_mount: str = "/efs"
    created_at: str = ""
    reason: str = "initial"
    schema: int = field(default=SCHEMA_VERSION)

    @property
    def master(self) -> Node:
        return self.nodes[0]

    @property
    def master_addr(self) -> str:
        return self.master.address

    def node_by_address(self, address: str) -> Node | None:
        return next((n for n in self.nodes if n.address == address), None)

    def node_by_instance(self, instance_id: str) -> Node | None:
        return next((n for n in self.nodes if n.instance_id == instance_id), None)

    # -- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict:
        # Field by field, not dataclasses.asdict: asdict deep-copies every value of every
        # node, which made this the largest cost of an apply on a 1,024-node cluster.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["nodes"] = [{name: getattr(n, name) for name in _NODE_FIELDS} for n in self.nodes]
        data["master_addr"] = self.master_addr
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping) -> Membership:
        if not isinstance(data, Mapping):
            raise MembershipError(f"membership must be a JSON object, got {type(data).__name__}")
        try:
            schema = data.get("schema", SCHEMA_VERSION)
            if schema != SCHEMA_VERSION or isinstance(schema, bool):
                raise MembershipError(f"unsupported membership schema {schema!r}")
            # 0 passes here so that validate() names it ("generation must be >= 1").
            generation = bounds.whole(data["generation"], field="generation", low=0,
                                      high=bounds.MAX_GENERATION)
            raw_nodes = data["nodes"]
            if not isinstance(raw_nodes, list) or not raw_nodes:
                raise MembershipError(f"membership 'nodes' must be a non-empty list: {raw_nodes!r}")
            if len(raw_nodes) > bounds.MAX_NODES:
                raise MembershipError(f"membership lists {len(raw_nodes)} nodes, more than "
                                      f"{bounds.MAX_NODES}")
            nodes = tuple(_node(n, i) for i, n in enumerate(raw_nodes))
        except MembershipError:
            raise
        except ProtocolError as exc:  # a number out of its range (bounds), field named
            raise MembershipError(str(exc).strip()) from None
        except (KeyError, TypeError, ValueError) as exc:
            raise MembershipError(f"malformed membership document: {exc!r}") from exc
        membership = cls(
            cluster_id=str(data.get("cluster_id", "")),
            generation=generation,
            nodes=nodes,
            efs_mount=str(data.get("efs_mount", "/efs")),
            created_at=str(data.get("created_at", "")),
            reason=str(data.get("reason", "")),
            schema=schema,
        )
        validate(membership)
        return membership

    @classmethod
    def from_json(cls, text: str) -> Membership:
        try:
            data = record_base.loads(text)
        except ProtocolError as exc:
            raise MembershipError(f"membership is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Membership:
        """The membership at ``path``; MembershipError names the file when it is malformed
        or is no regular file of text (read as :func:`store.read_text` reads: a FIFO, a
        link or a device in its place is refused without blocking); FileNotFoundError
        when there is none."""
        try:
            text = store.read_text(path)
        except ProtocolError as exc:
            raise MembershipError(str(exc)) from None  # names the file
        if text is None:
            raise FileNotFoundError(errno.ENOENT, "no membership", str(path))
        try:
            return cls.from_json(text)
        except MembershipError as exc:
            raise MembershipError(str(exc), source=str(path)) from None


def _node(n: Mapping, index: int) -> Node:
    """One entry of ``nodes``; numbers checked against their ranges (docs/protocol.md,
    "Numbers"), ``base`` a JSON boolean."""
    if not isinstance(n, Mapping):
        raise MembershipError(f"nodes[{index}] must be an object, got {type(n).__name__}")
    base = n.get("base", True)
    if not isinstance(base, bool):
        raise MembershipError(f"expected true or false, got {base!r}", field=f"nodes[{index}].base")
    return Node(
        rank=bounds.whole(n["rank"], field=f"nodes[{index}].rank", low=0,
                          high=bounds.MAX_NODES),
        role=str(n["role"]),
        instance_id=str(n["instance_id"]),
        address=str(ipaddress.ip_address(n["address"])),
        alias=str(n["alias"]),
        gpus=bounds.whole(n.get("gpus", 0), field=f"nodes[{index}].gpus", low=0,
                          high=bounds.MAX_GPUS),
        instance_type=str(n.get("instance_type", "")),
        base=base,
    )


def validate(m: Membership) -> None:
    """Reject documents that would make nodes disagree (duplicate addresses, bad ranks)."""
    if m.generation < 1:
        raise MembershipError(f"generation must be >= 1, got {m.generation}")
    if m.nodes[0].role != "master":
        raise MembershipError(f"first node must be the master, got role {m.nodes[0].role!r}")
    seen: set[str] = set()
    for expected_rank, node in enumerate(m.nodes):
        if node.rank != expected_rank:
            raise MembershipError(
                f"node {node.address} has rank {node.rank}, expected {expected_rank}"
            )
        if node.alias != alias_for(node.rank):
            raise MembershipError(
                f"node {node.address} (rank {node.rank}) has alias {node.alias!r}, expected "
                f"{alias_for(node.rank)!r}"
            )
        if node.role not in ("master", "worker"):
            raise MembershipError(f"node {node.address} has unknown role {node.role!r}")
        if node.address in seen:
            raise MembershipError(f"duplicate node address {node.address}")
        if node.gpus < 0:
            raise MembershipError(f"node {node.address} has negative GPU count {node.gpus}")
        seen.add(node.address)


def address_key(address: str) -> tuple[int, int]:
    ip = ipaddress.ip_address(address)
    return (ip.version, int(ip))


def build_membership(
    *,
    cluster_id: str,
    generation: int,
    master: Mapping,
    workers: Iterable[Mapping],
    efs_mount: str = "/efs",
    created_at: str = "",
    reason: str = "initial",
) -> Membership:
    """Order the nodes the way every consumer expects: master first, then workers.

    Workers are sorted numerically by IP address (the original sorted them as strings,
    which put 10.0.0.10 before 10.0.0.9). Each mapping needs ``instance_id``, ``address``
    and may carry ``gpus``, ``instance_type`` and ``base`` (default True; the master is
    always base). The master's own instance is dropped from
    ``workers`` if it appears there.
    """
    others = [w for w in workers if w["instance_id"] != master["instance_id"]]
    others.sort(key=lambda w: (address_key(w["address"]), w["instance_id"]))
    ordered = [("master", master), *(("worker", w) for w in others)]
    nodes = tuple(
        Node(
            rank=rank,
            role=role,
            instance_id=str(item["instance_id"]),
            address=str(ipaddress.ip_address(item["address"])),
            alias=alias_for(rank),
            gpus=int(item.get("gpus", 0)),
            instance_type=str(item.get("instance_type", "")),
            base=True if role == "master" else bool(item.get("base", True)),
        )
        for rank, (role, item) in enumerate(ordered)
    )
    m = Membership(
        cluster_id=cluster_id,
        generation=generation,
        nodes=nodes,
        efs_mount=efs_mount,
        created_at=created_at,
        reason=reason,
    )
    validate(m)
    return m


def membership_changes(old: Membership | None, new: Membership) -> list[tuple[str, str]]:
    """(ADDED|REMOVED, address) pairs between two generations, in membership order."""
    before = {n.address for n in old.nodes} if old else set()
    after = {n.address for n in new.nodes}
    changes = [("REMOVED", n.address) for n in (old.nodes if old else ()) if n.address not in after]
    changes += [("ADDED", n.address) for n in new.nodes if n.address not in before]
    return changes

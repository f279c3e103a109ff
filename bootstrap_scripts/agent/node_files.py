"""Apply a :class:`Membership` to one node's root: the files every job relies on.

What the files contain is rendered by :mod:`bootstrap_scripts.protocol.node_files` (the same
on every node, EC2 and EMR alike); this module only writes them.

Rules that make this safe to run at any time, any number of times:
- every file is written atomically (temp file + rename), and only when its content changes,
  so applying the same generation twice touches nothing (not even mtimes);
- a generation older than the one already applied is ignored (a slow worker can never
  roll a node back);
- the local ``membership.json`` is written LAST (and fsync'ed): its generation is the
  "applied" marker. The other files skip fsync: a node with N files x N nodes of fsyncs on
  one disk (the emulator) serialises badly, and nothing is lost, because the agent re-applies
  the current generation at every start and rewrites any file whose content differs.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts.protocol.membership import Membership, MembershipError, Node
from bootstrap_scripts.protocol.node_files import render_node_files
from bootstrap_scripts.protocol.paths import HOSTS_FILE, MEMBERSHIP_FILE, NodePaths
from bootstrap_scripts.protocol.store import atomic_write


@dataclass
class ApplyResult:
    generation: int
    status: str  # "applied" | "unchanged" | "older" | "not-a-member"
    changed: list[str] = field(default_factory=list)
    node: Node | None = None


def applied_generation(root: str | os.PathLike) -> int:
    """Generation recorded in the node's local membership.json (0 if none or unreadable)."""
    try:
        return Membership.load(NodePaths(root).membership).generation
    except (OSError, MembershipError):
        return 0


def find_self(m: Membership, instance_id: str, address: str = "") -> Node | None:
    """This node in ``m``: by instance id (addresses can be reused after a replacement)."""
    node = m.node_by_instance(instance_id)
    if node is None and address and not instance_id:
        node = m.node_by_address(address)
    return node


def apply_membership(
    root: str | os.PathLike, m: Membership, *, instance_id: str, address: str = "",
    applied: int | None = None,
) -> ApplyResult:
    """Write ``m``'s files for this node (module doc). ``applied``: the generation this
    node applied last, from a caller that holds it (the node agent: it read the local
    membership once at start and applied every generation since), so the applied
    membership is not parsed again on every apply just for its generation; None reads it
    from the node's ``membership.json`` (:func:`applied_generation`: a one-shot caller)."""
    root = Path(root)
    current = applied_generation(root) if applied is None else applied
    if m.generation < current:
        return ApplyResult(m.generation, "older")
    node = find_self(m, instance_id, address)
    if node is None:
        return ApplyResult(m.generation, "not-a-member")
    try:
        existing_hosts = NodePaths(root).hosts.read_text()
    except FileNotFoundError:
        existing_hosts = ""
    files = render_node_files(m, node, root=root, existing_hosts=existing_hosts)
    membership_doc = files.pop(MEMBERSHIP_FILE)
    changed = []
    for rel, content in files.items():
        if _write(root / rel, content, rel):
            changed.append(rel)
    if atomic_write(NodePaths(root).membership, membership_doc):
        changed.append(MEMBERSHIP_FILE)
    return ApplyResult(m.generation, "applied" if changed else "unchanged", changed, node)


def _write(path: Path, content: str, rel: str) -> bool:
    try:
        return atomic_write(path, content, fsync=False)
    except OSError as exc:
        # /etc/hosts is a bind mount in containers: rename over it fails with EBUSY.
        if rel == HOSTS_FILE and exc.errno in (errno.EBUSY, errno.EXDEV, errno.EPERM):
            with contextlib.suppress(FileNotFoundError):
                if path.read_text() == content:
                    return False
            path.write_text(content)
            return True
        raise

"""What an operator's tool (``dl-health``, ``dl-scale``) may believe of the nodes' records.

Root on any worker can write any node's registration (``cluster/nodes/<id>.json``) and
executor heartbeat (``cluster/executors/<address>.json``) on EFS. The master believes one only
with the signature of the node it names (``bootstrap_scripts.node.node_keys``), with the keys its
agent learnt from the instances themselves (``var/lib/dl-agent/node-keys/``, on the master's
own disk). The operators' tools read the same records: on the master they check them the
same way and say, per node, whether its record is its own; a decision they take (which
instances ``dl-scale`` lists and names) uses only checked records. A worker holds no key
book: there the tools say plainly that what they show is unchecked.

:func:`verdict` is the pure table; :class:`NodeRecords` the reader.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from bootstrap_scripts.jobs.engine.reachability import LatestBeats, read_heartbeat
from bootstrap_scripts.node.node_keys import KeyBook, RecordCheck
from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.record_base import Record
from bootstrap_scripts.protocol.records import ExecutorHeartbeat, Registration

R = TypeVar("R", bound=Record)

#: A record its node signed (checked against the key the master learnt from it).
CHECKED = "checked"
#: Read on a node that holds no key book (a worker; a stack without node keys).
UNCHECKED = "unchecked"
#: The master learnt no key from that instance (yet): it counts as not registered.
WAITING_FOR_KEY = ("waiting for its node key (older user data? replace the instance: an "
                   "instance refresh)")
#: A record the master does not believe: not that node's signature (``: why`` follows).
NOT_SIGNED = "not signed by that node"
#: What a tool prints once on a node without a key book.
UNCHECKED_HERE = ("node records are unchecked here: only the master holds the nodes' keys "
                  "(run this on the master to check them)")


def verdict(*, book: bool, key_learnt: bool, why: str) -> str:
    """What an operator is told of one record: ``book``: this node checks records (the
    master's key book is here and readable); ``key_learnt``: the named node's key is in it;
    ``why``: why the check refused the record ("" when it held, or the file is missing)."""
    if not book:
        return UNCHECKED
    if not key_learnt:
        return WAITING_FOR_KEY
    return f"{NOT_SIGNED}: {why}" if why else CHECKED


@dataclass(frozen=True)
class NodeRead(Generic[R]):
    """One node record (a registration, a heartbeat) as a tool may use it: ``record`` is
    None when missing or not believed; ``verdict`` says which (:func:`verdict`)."""

    record: R | None
    verdict: str

    @property
    def believed(self) -> bool:
        return self.verdict in (CHECKED, UNCHECKED)


class NodeRecords:
    """The nodes' registrations and heartbeats on ``efs``, checked when the key book of the
    node at ``root`` is there (the master, run as root: the book is root's, 0700)."""

    def __init__(self, root: str | os.PathLike, efs: Path) -> None:
        book = KeyBook(NodePaths(root))
        quiet = logging.getLogger("dl-node-records")
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False  # the tools show why; the master's own log says it too
        self.check = RecordCheck(book, quiet)
        self.paths = ClusterPaths(efs)
        self.efs = efs
        #: this node checks records (a book a non-root reader cannot open checks nothing)
        self.checked = book.enabled and os.access(book.directory, os.R_OK | os.X_OK)
        #: the controller's replay rule over the heartbeats this reader checked: in one run
        #: (``dl-health`` looks for a few seconds), an older beat of the node's own put back
        #: is not a move
        self.beats = LatestBeats()

    def _read(self, path: Path, cls: type[R], instance_id: str, what: str,
              fields: dict, plain) -> NodeRead[R]:
        if not self.checked:
            return NodeRead(plain(), UNCHECKED)
        # read as the master's controller does (a key not learnt: plainly), and say which
        judged = self.check.judge_or_plain(path, cls, instance_id=instance_id, what=what,
                                           plain=plain, fields=fields)
        return NodeRead(judged.record, verdict(book=True, key_learnt=judged.learnt,
                                               why=judged.why))

    def registration(self, instance_id: str) -> NodeRead[Registration]:
        return self._read(self.paths.registration(instance_id), Registration, instance_id,
                          "node registration", {"instance_id": instance_id},
                          lambda: state.read_registration(self.efs, instance_id))

    def heartbeat(self, address: str, instance_id: str) -> NodeRead[ExecutorHeartbeat]:
        """``address``'s executor heartbeat, believed from ``instance_id`` (the node the
        membership puts there). A checked beat older than one this reader saw is a replay:
        the latest believed stays the record, as for the job controller."""
        read = self._read(self.paths.executor_heartbeat(address), ExecutorHeartbeat,
                          instance_id, "executor heartbeat", {"address": address},
                          lambda: read_heartbeat(self.efs, address))
        if read.verdict != CHECKED:  # unchecked: no replay check, nothing remembered
            return read
        beat, _replay = self.beats.take(address, read.record)
        return NodeRead(beat, CHECKED)

    def registrations(self) -> dict[str, NodeRead[Registration]]:
        """Every registration on EFS by its file's instance id (a record naming another
        instance than its file is not that node's)."""
        return {iid: self.registration(iid) for iid in sorted(state.registered_ids(self.efs))}

"""A node's signing key on its own disk, and the master's book of every node's public key.

The records a node writes for the master on EFS (its registration, its job executor's
heartbeat, its drain acknowledgement) carry its signature (:mod:`bootstrap_scripts.protocol.
node_signature`); here are the files around it, all on the node's LOCAL disk, never on EFS
(root on any worker can write EFS; nobody but this node's root writes its disk):

- ``var/lib/dl-agent/node-key.pem``: the node's private key, made once by its agent (root,
  0600, never through a link; a file not root's or readable by others is refused, not used)
  and read by the agent and the job executor, which sign with it;
- ``var/lib/dl-agent/node-keys/<instance-id>.pem`` (the master): each node's public key, as
  the master's agent learnt it from that very instance (``agent.node_keys_queue``); the job
  controller, on the same node, reads it. The directory exists only once the master serves
  the node-keys queue: a master without one (a stack that has no queue) checks nothing
  (only the master's root can make it, on the master's own disk).

:class:`RecordCheck` is the master's reader: a record that is not the named node's own is
ignored (None), with one log line per file and reason. Its :meth:`RecordCheck.judge_or_plain`
is the one home of the rule for a node whose key is not learnt yet (read plainly, said so),
which the controller's heartbeat reader and the operators' tools both follow.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from bootstrap_scripts.protocol import membership_signature as msig
from bootstrap_scripts.protocol import node_signature as nsig
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.paths import NodePaths
from bootstrap_scripts.protocol.record_base import Record

R = TypeVar("R", bound=Record)

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
#: Log lines about refused records kept per process (one per file and reason).
_LOGGED_LIMIT = 10_000


def _read_own(path: Path) -> bytes | None:
    """``path``'s bytes when it is a regular file of ours (root's) that nobody else may read
    or write; None when missing. Anything else raises OSError naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise OSError(f"{path}: not a private file of uid {os.geteuid()} "
                          f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): not used")
        return fh.read(64 * 1024)


def load_or_make(paths: NodePaths):
    """This node's private key: the one on its disk, else a new one written there (0600,
    ``O_EXCL``: two starters never both write). The agent calls it at boot."""
    pem = _read_own(paths.node_key)
    if pem is not None:
        return nsig.load_private(pem)
    key = nsig.new_private_key()
    paths.node_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(paths.node_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    except FileExistsError:  # another starter won: use its key
        return nsig.load_private(_read_own(paths.node_key) or b"")
    with os.fdopen(fd, "wb") as fh:
        fh.write(nsig.private_pem(key))
        fh.flush()
        os.fsync(fh.fileno())
    return key


def fingerprint(public_pem: bytes) -> str:
    return hashlib.sha256(public_pem).hexdigest()[:16]


def signer(paths: NodePaths) -> msig.Signer | None:
    """A signer with this node's key, None while the agent has made none (an executor that
    started first signs once it is there; a node of a stack without node keys never)."""
    try:
        pem = _read_own(paths.node_key)
    except OSError as exc:
        logging.getLogger("dl-node-key").error("event=node-key-refused error=%s", exc)
        return None
    if pem is None:
        return None
    key = nsig.load_private(pem)
    return nsig.signer(key, fingerprint(nsig.public_pem(key)))


class NodeSigner:
    """:func:`signer`, looked for until the agent made the key, then kept (the job
    executor signs every heartbeat: one file read, not one a second)."""

    def __init__(self, paths: NodePaths) -> None:
        self.paths = paths
        self._sign: msig.Signer | None = None

    def signed(self, text: str) -> str:
        """``text`` (a record's JSON) signed with this node's key, unchanged without one."""
        if self._sign is None:
            self._sign = signer(self.paths)
        return nsig.signed_record(text, self._sign)


class KeyBook:
    """The master's learnt public keys (``node-keys/<instance-id>.pem``), re-read when a
    file changes."""

    def __init__(self, paths: NodePaths) -> None:
        self.directory = paths.node_keys_dir
        self._cache: dict[str, tuple[tuple[int, int], object]] = {}

    @property
    def enabled(self) -> bool:
        """The master serves the node-keys queue (its agent made the directory)."""
        return self.directory.is_dir()

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    def save(self, instance_id: str, public_pem: bytes) -> bool:
        """Record ``instance_id``'s key (checked to be one); True when it changed."""
        if not nsig.INSTANCE_ID.match(instance_id):
            raise nsig.NodeKeyError(f"not an instance id: {instance_id!r}")
        nsig.load_public(public_pem)
        return store.atomic_write(self.directory / f"{instance_id}.pem", public_pem.decode(),
                                  mode=0o600)

    def key_of(self, instance_id: str):
        """``instance_id``'s public key, None when not learnt (or its file is unusable)."""
        if not nsig.INSTANCE_ID.match(instance_id or ""):
            return None
        path = self.directory / f"{instance_id}.pem"
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._cache.get(instance_id)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            key = nsig.load_public(_read_own(path) or b"")
        except (OSError, nsig.NodeKeyError):
            return None
        self._cache[instance_id] = (stamp, key)
        return key


@dataclass(frozen=True)
class Judged(Generic[R]):
    """A node record as :meth:`RecordCheck.judge_or_plain` read it: ``record`` (None when
    missing or not believed), ``why`` it is not believed, or why it was read unchecked (""
    when it held or is missing), and whether the node's key was ``learnt`` (False: the
    record was read plainly, unchecked)."""

    record: R | None
    why: str
    learnt: bool


def unlearnt(instance_id: str) -> str:
    """Why a record of ``instance_id`` was read unchecked: its key is not learnt yet."""
    return f"no key learnt from {instance_id} yet: read unchecked until it is"


class RecordCheck:
    """The master's reader of node records: the text of a record that is the named node's
    own, else None and one log line naming the file and why."""

    def __init__(self, book: KeyBook, log: logging.Logger) -> None:
        self.book = book
        self.log = log
        self._logged: set[tuple[str, str]] = set()

    @classmethod
    def for_node(cls, paths: NodePaths, log: logging.Logger) -> RecordCheck:
        return cls(KeyBook(paths), log)

    @property
    def active(self) -> bool:
        """Records are checked: this master learns node keys (looked at every time, so a
        master that opens its book later starts checking then)."""
        return self.book.enabled

    def refuse(self, path: Path | str, why: str) -> None:
        if (str(path), why) not in self._logged and len(self._logged) < _LOGGED_LIMIT:
            self._logged.add((str(path), why))
            self.log.warning("event=node-record-ignored record=%s reason=%s", path, why)

    def read(self, path: Path, *, instance_id: str, what: str,
             fields: Mapping[str, object] | None = None) -> tuple[str | None, str]:
        """(``path``'s text, "") when it is ``instance_id``'s own ``what``; (None, why not),
        why "" when the file is missing or unreadable. Nothing is logged (operators' tools
        show why instead)."""
        try:
            text = store.read_text(path, limit=store.NODE_RECORD_LIMIT)
        except store.RecordTooLarge as exc:
            return None, str(exc)
        except OSError:
            return None, ""
        if text is None:
            return None, ""
        why = nsig.check(text, instance_id=instance_id, key_of=self.book.key_of, what=what,
                         fields=fields)
        return (None, why) if why else (text, "")

    def text(self, path: Path, *, instance_id: str, what: str,
             fields: Mapping[str, object] | None = None) -> str | None:
        """``path``'s text when it is ``instance_id``'s own ``what``; None when missing or
        not (logged)."""
        text, why = self.read(path, instance_id=instance_id, what=what, fields=fields)
        if why:
            self.refuse(path, why)
        return text

    def judge(self, path: Path, cls: type[R], *, instance_id: str, what: str,
              fields: Mapping[str, object] | None = None) -> tuple[R | None, str]:
        """(the ``cls`` record at ``path``, "") when it is ``instance_id``'s own (checked
        like :func:`state.read_checked`, from the very bytes whose signature was checked);
        (None, why not), why "" when missing. Nothing is logged."""
        text, why = self.read(path, instance_id=instance_id, what=what, fields=fields)
        if text is None:
            return None, why
        try:
            rec = cls.from_json(text, source=str(path))
        except ProtocolError as exc:
            return None, str(exc)
        ranges = state.RECORD_RANGES.get(cls, {})
        if not state.read_checked_fields(rec, ranges, source=str(path)):
            return None, "a number out of range"
        return rec, ""

    def judge_or_plain(self, path: Path, cls: type[R], *, instance_id: str, what: str,
                       plain: Callable[[], R | None],
                       fields: Mapping[str, object] | None = None) -> Judged[R]:
        """:meth:`judge`, except for a node whose key this master has not learnt (yet): its
        record is read plainly (``plain()``), unchecked, and said so (``learnt`` False, ``why``
        :func:`unlearnt`). The window is seconds (a master that just took over: every worker
        sends its key again to a new master), and a record read as missing would be worse
        than one read unchecked: the controller would mark a healthy node whose heartbeat
        it cannot see Unhealthy. One rule for every reader, so an operator's tool shows
        what the controller believes. Nothing is logged."""
        if self.book.key_of(instance_id) is None:
            return Judged(plain(), unlearnt(instance_id), learnt=False)
        rec, why = self.judge(path, cls, instance_id=instance_id, what=what, fields=fields)
        return Judged(rec, why, learnt=True)

    def record(self, path: Path, cls: type[R], *, instance_id: str, what: str,
               fields: Mapping[str, object] | None = None) -> R | None:
        """:meth:`judge`'s record, a refusal logged once per file and reason."""
        rec, why = self.judge(path, cls, instance_id=instance_id, what=what, fields=fields)
        if why:
            self.refuse(path, why)
        return rec

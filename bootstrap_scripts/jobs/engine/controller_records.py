"""The job controller's own records, signed by the master: what a successor reads as truth.

The controller keeps three records on EFS and a new controller (a restarted one, or a new
master's after a take-over) reads them back: each managed job's record (state, attempt,
restarts, the cost ledger that ``--max-cost`` is checked against), the circuit breaker's
marks (``cluster/breaker.json``) and the idle stop (``cluster/idle-stop.json``: whether the
workers were stopped and the size to scale them back to). Every node mounts EFS as root, so
root on any worker can write any of them; and the job's ``managed/<user>/<id>/job.json`` is
written as the job's user, in the user's own directory, so the user can rewrite it too.

So the records the controller trusts carry the master's signature, made the way every word
only the master may say is made: the membership key (``kms:Sign``, the master's role alone;
``protocol.membership_signature``'s canonical form, the signature inside the document) and
checked locally with the key's public half (``agent.membership_key``). A job's trusted
record is a copy in ``cluster/managed/<user>/<id>.json``, a root-owned tree no user can
write: the user's ``job.json`` stays what ``dl-jobs`` shows, and a user replaying an older
``job.json`` the master once signed changes nothing the controller reads. What root on a
worker could still replay (an older signed copy it saved) is said in docs/security.md.

A record the controller cannot sign (KMS unreachable) is written unsigned and signed again
at the controller's next heartbeat until it is (``pending``), as the drain records are;
the idle stop's record is written only signed (``write_signed``), because the controller
acts on it at once (it stops the workers) and a successor must find the size to restore. A
record that does not check out is not believed: one ``event=controller-record-ignored``
line names the file and why, and the caller treats it as untrusted (each says how). KMS
unreachable while checking raises ``MembershipKeyError``: the caller looks again later and
concludes nothing. A node without an installed key (the emulator's bare clusters) signs and
checks nothing, as the membership does.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from bootstrap_scripts.agent.membership_key import MembershipKeyError
from bootstrap_scripts.jobs.engine import root_jobs
from bootstrap_scripts.protocol import membership_signature, record_base, store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.record_base import Record

LOG = logging.getLogger("dl-controller")
R = TypeVar("R", bound=Record)
#: The controller's tree of trusted job records is root's: no user writes in it.
DIR_MODE = 0o755
_LOGGED_LIMIT = 1000
#: The largest controller record read: a job record with a long restart log and cost ledger
#: is some KiB; root on a worker can plant any size in cluster/.
RECORD_LIMIT = store.TEXT_LIMIT


class Trust(StrEnum):
    """What a read of a controller record found."""

    SIGNED = "signed"  # the master's signature holds (or the node has no key to check with)
    ABSENT = "absent"  # no record: a job not picked up yet, or written by an older controller
    REFUSED = "refused"  # there, but not the master's word (unsigned, forged, garbled)
    UNCHECKED = "unchecked"  # KMS could not be asked for the public key: look again later


@dataclass(frozen=True)
class SealedRead:
    """One read of a controller record the master seals (signs): the record (when it
    parsed), how far it is trusted, and why not (for the log line and a failed job's
    message)."""

    trust: Trust
    record: Record | None = None
    why: str = ""


class ControllerSeal:
    """The master's signer and the local checker of the controller's records."""

    def __init__(self, sign: root_jobs.Sign | None, verify: root_jobs.Verify | None,
                 *, log: logging.Logger = LOG,
                 ready: Callable[[], bool] | None = None) -> None:
        self.sign, self.verify, self.log = sign, verify, log
        self._ready = ready
        #: records written unsigned because KMS could not sign (path -> record)
        self.pending: dict[Path, Record] = {}
        #: KMS Sign calls made (the rate docs/security.md states is measured from this)
        self.signs = 0
        self._logged: set[tuple[str, str]] = set()
        #: what each file held when last checked, by (path, inode, size, mtime, ctime) of
        #: the very file read: the queue looks at every job twice a second, and a file
        #: replaced (every write is a rename) or changed in place is checked again
        self._checked: dict[Path, tuple[tuple[int, ...], SealedRead]] = {}

    @classmethod
    def for_node(cls, root: str | Path, log: logging.Logger = LOG) -> ControllerSeal:
        """The node's membership key (none: nothing signed nor checked)."""
        key = root_jobs.node_key(root)
        if key is None:
            return cls(None, None, log=log)
        return cls(key.sign, key.verify, log=log, ready=lambda: key.prepare(log))

    def ready(self) -> bool:
        """The public key is at hand, so no check has to ask KMS (False: ask again later)."""
        return self._ready() if self._ready is not None else True

    # -- writing -------------------------------------------------------------------------
    def signed(self, record: Record) -> str | Exception:
        """``record`` as it is written signed (as it is when there is no key), or why KMS
        could not sign it now."""
        text = record.to_json()
        if self.sign is None:
            return text
        try:
            signed = membership_signature.signed_text(text, self.sign)
        except Exception as exc:  # MembershipKeyError: KMS unreachable, throttled
            return exc
        self.signs += 1
        return signed

    def text(self, record: Record) -> tuple[str, bool]:
        """``record`` as it is written (signed when there is a key) and whether it is."""
        signed = self.signed(record)
        if isinstance(signed, Exception):
            self.log.warning("event=controller-record-unsigned error=%s (signed again at "
                             "the next heartbeat)", signed)
            return record.to_json(), False
        return signed, True

    def write(self, path: Path, record: Record) -> None:
        """Write ``path`` (root's, 0644) signed; unsigned and kept in :attr:`pending` when
        KMS cannot sign now. Parent directories are made root's (0755)."""
        text, signed = self.text(record)
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        store.atomic_write(path, text, mode=0o644)
        if signed:
            self.pending.pop(path, None)
        else:
            self.pending[path] = record

    def write_signed(self, path: Path, record: Record) -> bool:
        """Write ``path`` only signed: False, nothing written, when KMS cannot sign now (the
        signed record already there stays what a successor reads). For a record that must be
        the master's word BEFORE the caller acts on it: one written unsigned would be refused
        by a successor if the master died before it was signed again, so what it records
        would be forgotten (the idle stop's size to restore)."""
        signed = self.signed(record)
        if isinstance(signed, Exception):
            self.log.warning("event=controller-record-unsigned record=%s error=%s (not "
                             "written: the caller tries again later)", path, signed)
            return False
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        store.atomic_write(path, signed, mode=0o644)
        self.pending.pop(path, None)
        return True

    def retry(self) -> None:
        """Sign again what was written unsigned (each at most once per call)."""
        for path, record in list(self.pending.items()):
            if self.pending.get(path) is record:
                try:
                    self.write(path, record)
                except OSError as exc:
                    self.log.warning("cannot rewrite %s: %s", path, exc)

    # -- reading -------------------------------------------------------------------------
    def refuse(self, path: Path, why: str) -> None:
        if (str(path), why) not in self._logged and len(self._logged) < _LOGGED_LIMIT:
            self._logged.add((str(path), why))
            self.log.warning("event=controller-record-ignored record=%s reason=%s", path, why)

    def read(self, path: Path, cls: type[R], what: str) -> SealedRead:
        """The record at ``path`` and whether it is the master's (UNCHECKED when KMS cannot
        be asked for the public key: look again, conclude nothing)."""
        try:
            fd = os.open(path, store.READ_FLAGS)
        except FileNotFoundError:
            self._checked.pop(path, None)
            return SealedRead(Trust.ABSENT)
        except OSError as exc:
            self.refuse(path, f"cannot open: {exc}")
            return SealedRead(Trust.REFUSED, why=f"{path} cannot be opened ({exc})")
        st = os.fstat(fd)  # before a file object: io refuses a directory with its own error
        if not stat.S_ISREG(st.st_mode) or st.st_size > RECORD_LIMIT:
            os.close(fd)
            why = (f"not a regular file of at most {RECORD_LIMIT} bytes (mode "
                   f"{st.st_mode:o}, {st.st_size} bytes)")
            self.refuse(path, why)
            return SealedRead(Trust.REFUSED, why=f"{path}: {why}")
        with os.fdopen(fd, "rb") as fh:
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            seen = self._checked.get(path)
            if seen is not None and seen[0] == stamp:
                return seen[1]
            try:
                text = fh.read(RECORD_LIMIT + 1).decode()
            except (OSError, UnicodeDecodeError) as exc:
                self.refuse(path, f"cannot read: {exc}")
                return SealedRead(Trust.REFUSED, why=f"{path} cannot be read ({exc})")
        found = self.check(path, text, cls, what)
        if found.trust is not Trust.UNCHECKED:
            self._checked[path] = (stamp, found)
        return found

    def check(self, path: Path, text: str, cls: type[R], what: str) -> SealedRead:
        """``text`` (read from ``path``) as a ``cls`` and whether the master signed it."""
        if self.verify is not None:
            try:
                why = membership_signature.check(text, self.verify, what)
            except MembershipKeyError as exc:  # never concluded: the caller looks again
                self.log.warning("cannot check %s now: %s", path, exc)
                return SealedRead(Trust.UNCHECKED, why=str(exc))
            if why:
                self.refuse(path, why)
                return SealedRead(Trust.REFUSED, why=why)
        try:
            data = record_base.loads(text)
            if isinstance(data, dict):
                data.pop(membership_signature.FIELD, None)
            return SealedRead(Trust.SIGNED, cls.from_dict(data, source=str(path)))
        except (ValueError, ProtocolError) as exc:
            self.refuse(path, str(exc))
            return SealedRead(Trust.REFUSED, why=str(exc))


# -- the job records ----------------------------------------------------------------------
def read_job(seal: ControllerSeal, efs: Path, key: str) -> SealedRead:
    """The controller's signed record of job ``key`` (``cluster/managed/<user>/<id>.json``)."""
    return seal.read(ClusterPaths(efs).controller_job(key), ManagedJob, "job record")


def write_job(seal: ControllerSeal, efs: Path, key: str, job: ManagedJob) -> None:
    """Write it, as root (the caller is not the job's user here), signed."""
    seal.write(ClusterPaths(efs).controller_job(key), job)


def trusted_job(read: SealedRead) -> ManagedJob | None:
    return read.record if read.trust is Trust.SIGNED and isinstance(read.record, ManagedJob) \
        else None

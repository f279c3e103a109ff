"""Finding the jobs this node has to run in ``<EFS>/jobs/<user>/``.

Every job is named by its key ``<user>/<job-id>`` here: two users may have jobs of the same
id, each in their own directory (``user_dirs.user_dirs`` lists only directories named after
a user and owned by them: the old flat layout's ``jobs/<job-id>/`` is never acted on).

A job directory is looked at until its fate on this node is settled (``seen``): started,
not for this node, finished, cancelled, or never given a spec. Jobs found at start-up (and
jobs whose spec appeared while their runner looked dead) are only started once their
runner's heartbeat moves: a rebooting node must not replay old jobs.

Why not list every ``jobs/<user>/`` every poll: finished jobs stay there (their logs are
the record), so an idle node's cost would grow with the cluster's history (10,000 finished jobs: a
10,000-entry listing five times a second on every node). Instead each poll opens the
directories and compares their stamps (inode, mtime, ctime, link count: ``fstat`` after an
``open``, which on NFS/EFS revalidates the attributes: close-to-open consistency) and lists
them only when a stamp changed; unsettled jobs (no spec yet, runner on probation) are
re-checked by name. A new job's directory changes the stamp; the listings go on for
``FOLLOW_UP_SECONDS`` after any change, because two changes within one tick of the file
server's clock leave the same mtime; and one listing every ``SAFETY_LISTING_SECONDS`` is a
last resort that costs next to nothing. inotify would not see other nodes' writes on NFS.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from bootstrap_scripts.jobs.engine import root_jobs, user_dirs, userfiles
from bootstrap_scripts.jobs.executor import listeners, store_guard
from bootstrap_scripts.jobs.executor.drain import Drain
from bootstrap_scripts.jobs.executor.elastic import ElasticJoins
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.probation import STARTUP_LIVENESS_SECONDS, RunnerProbation
from bootstrap_scripts.jobs.executor.share_command import job_owner
from bootstrap_scripts.jobs.executor.shares import Shares
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec, Share
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import ShareStarted

LOG = logging.getLogger("dl-executor")

#: A job directory with no spec.json after this long is a dry run or a crashed runner.
SPECLESS_GIVE_UP_SECONDS = 60.0
#: After ``jobs/`` changed, it is listed on every poll for this long (see the docstring).
FOLLOW_UP_SECONDS = 2.0
#: ``jobs/`` is listed at least this often even when its stamp never changes.
SAFETY_LISTING_SECONDS = 60.0

DirStamp = tuple[int, int, int, int]


def dir_stamp(path: os.PathLike | str) -> DirStamp | None:
    """What changes when an entry is added to or removed from a directory (None: no
    directory). The open (not a plain stat) makes an NFS client ask the server."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink


class JobScanner:
    """The jobs of ``<EFS>/jobs/`` and what this node does about each."""

    def __init__(self, node: ThisNode, shares: Shares, joins: ElasticJoins,
                 drain: Drain) -> None:
        self.node = node
        self.shares = shares
        self.joins = joins
        self.drain = drain
        #: root's specs run only with the master's signature (``root_jobs``)
        self.verify_root = root_jobs.verifier(node.paths.root)
        shares.root_specs = set() if self.verify_root is not None else None
        self.seen: set[str] = set()
        self.specless: dict[str, float] = {}
        self.probation = RunnerProbation()  # jobs found at start-up
        self.first_scan = True
        #: jobs listed but not settled yet: re-checked every poll without a listing
        self.pending: set[str] = set()
        self.stamp: tuple | None = None
        #: ``jobs/``'s own stamp and its users' directories as last listed
        self.top_stamp: DirStamp | None = None
        self.users: list[tuple[str, Path]] = []
        self.changed_at = self.listed_at = 0.0
        #: directory listings done (the bench and the tests count them)
        self.listings = 0
        #: jobs whose share waits for the master's listener: since when (monotonic)
        self.listener_waits: dict[str, float] = {}

    def read_spec(self, job_id: str, paths: JobPaths, now: float) -> JobSpec | None:
        """The job's spec; None while it has none yet, or (then ``seen``) never will.
        Read without following links and only when it is its directory's owner's
        (:func:`userfiles.read_owned`): root never reads a spec through a user's link."""
        try:
            owned = userfiles.read_owned(paths.dir, paths.spec.name)
        except FileNotFoundError:
            first = self.specless.setdefault(job_id, now)
            if now - first > SPECLESS_GIVE_UP_SECONDS:
                self.seen.add(job_id)
            return None
        except (OSError, UnicodeDecodeError) as exc:
            LOG.error("job %s: unusable spec, ignoring it: %s", job_id, exc)
            self.seen.add(job_id)
            return None
        try:
            refused = root_jobs.refusal(paths.dir, paths.spec.name, owned.text, owned.uid,
                                        self.verify_root)
        except Exception as exc:  # KMS cannot be asked now: look again at the next poll
            LOG.warning("job %s: cannot check root's spec now: %s", job_id, exc)
            return None
        if refused:  # root on some node planted it: nothing of it runs here
            LOG.error("job %s: refused: %s", job_id, refused)
            self.seen.add(job_id)
            return None
        if owned.uid == 0 and self.shares.root_specs is not None:
            self.shares.root_specs.add(job_id)
        try:
            return JobSpec.from_json(owned.text)
        except ProtocolError as exc:
            LOG.error("job %s: unreadable spec, ignoring it: %s", job_id, exc)
            self.seen.add(job_id)
            return None

    def stamps(self, now: float) -> tuple:
        """The stamps of ``jobs/`` and of every user's directory in it; ``jobs/`` itself is
        listed again only when its own stamp changed (a user's directory made) or at the
        safety listing."""
        jobs = self.node.cluster.jobs_dir
        top = dir_stamp(jobs)
        if top != self.top_stamp or now - self.listed_at >= SAFETY_LISTING_SECONDS:
            self.top_stamp, self.users = top, list(user_dirs.user_dirs(jobs))
        return (top, *((u, dir_stamp(d)) for u, d in self.users))

    def candidates(self, now: float) -> list[str]:
        """The job keys to look at this poll: a listing of every ``jobs/<user>/`` when one
        changed (or just did, or long ago), else only the unsettled ones."""
        stamp = self.stamps(now)
        if stamp != self.stamp:
            self.stamp, self.changed_at = stamp, now
        if not (self.first_scan or now - self.changed_at <= FOLLOW_UP_SECONDS
                or now - self.listed_at >= SAFETY_LISTING_SECONDS):
            return sorted(self.pending)
        self.listed_at = now
        self.listings += 1
        keys = []
        for user, directory in self.users:
            try:
                with os.scandir(directory) as it:
                    keys += [f"{user}/{e.name}" for e in it if e.is_dir(follow_symlinks=False)]
            except (FileNotFoundError, NotADirectoryError):
                continue
        return keys

    def scan(self) -> None:
        now = time.monotonic()
        for job_id in self.candidates(now):
            if job_id in self.seen or job_id in self.shares.running or "/." in job_id:
                self.pending.discard(job_id)
                continue
            self.look_at(job_id, now)
            if job_id in self.seen or job_id in self.shares.running:
                self.pending.discard(job_id)
            else:
                self.pending.add(job_id)
        self.first_scan = False

    def look_at(self, job_id: str, now: float) -> None:
        """Settle the job ``job_id`` (a key) if its fate on this node is known, else leave it
        pending."""
        try:
            paths = self.node.cluster.job(job_id)
        except ProtocolError:  # not a job id: nobody published it as a job
            self.seen.add(job_id)
            return
        if userfiles.exists(paths.done) or userfiles.exists(paths.cancel):
            self.seen.add(job_id)
            return
        spec = self.read_spec(job_id, paths, now)
        if spec is None:
            return
        self.consider(spec, paths)

    def consider(self, spec: JobSpec, paths: JobPaths) -> None:
        """Start this node's share of ``spec`` if it has one and nothing speaks against it.
        Every node, with a share or not, first keeps other users away from the job's
        store (``store_guard``): every node's connections leave through its own kernel."""
        job_id = paths.key
        self.guard_store(spec, paths)
        share = spec.share_for(self.node.address) or self.joins.joined_share(spec, paths)
        if share is None and spec.elastic and spec.join_template is not None:
            self.joins.wait(spec, paths)
            self.seen.add(job_id)
            return
        if share is not None and self.first_scan and userfiles.exists(paths.started(share.rank)) \
                and not userfiles.exists(paths.exit(share.rank)):
            self.shares.reattach(spec, share, paths)
            return
        if share is None or userfiles.exists(paths.exit(share.rank)) or \
                userfiles.exists(paths.started(share.rank)):
            self.seen.add(job_id)
            return
        if self.drain.requested:
            self.seen.add(job_id)  # leaving the cluster: no new work
            return
        if self.first_scan or self.probation.watching(job_id):
            verdict = self.probation.check(job_id, paths, STARTUP_LIVENESS_SECONDS)
            if verdict == RunnerProbation.DEAD:
                LOG.info("job %s: runner not alive, not starting it", job_id)
                self.seen.add(job_id)
            if verdict != RunnerProbation.ALIVE:
                return
        if not self.listener_ready(spec, share, paths):
            return
        if not self.shares.credentials_ready(paths):
            return  # STS answers on its thread; a cancel meanwhile settles the job above
        if not self.shares.start(spec, share, paths):
            self.seen.add(job_id)

    def guard_store(self, spec: JobSpec, paths: JobPaths) -> None:
        """Guard the job's store from this node (a share's start guards it again, and is
        refused when it cannot be; a node without a share can only say so)."""
        if store_guard.endpoint(spec) is None:
            return
        try:
            uid, _gid = job_owner(paths)
            self.shares.guards.guard(spec, paths, uid)
        except (OSError, store_guard.GuardError) as exc:
            LOG.error("job %s: cannot guard its rendezvous store from this node: %s",
                      paths.key, exc)

    def listener_ready(self, spec: JobSpec, share: Share, paths: JobPaths) -> bool:
        """Whether this share may start as far as the job's listener goes: a share of a job
        whose master's executor binds the rendezvous listener starts only once that share
        has started without error (root holds the port for the job's own store, so no
        agent of ours meets another's); a master share that failed to start settles the
        job here; one that never starts within the spec's orphan timeout too."""
        holder = listeners.waits_for_listener(spec, share)
        if holder is None:
            return True
        job_id = paths.key
        rec = userfiles.read_record_or_none(paths.started(holder.rank), ShareStarted)
        if rec is not None and not rec.error:
            self.listener_waits.pop(job_id, None)
            return True
        waited = time.monotonic() - self.listener_waits.setdefault(job_id, time.monotonic())
        if rec is not None or waited > spec.orphan_timeout:
            LOG.error("job %s: not starting its share: the master's share %s", job_id,
                      f"could not start ({rec.error})" if rec is not None else
                      f"did not start within {spec.orphan_timeout:.0f} s")
            self.listener_waits.pop(job_id, None)
            self.seen.add(job_id)
        return False

"""Per-node job executor: starts this node's share of every job ``dl-run`` publishes on EFS.

``python3 -m bootstrap_scripts.jobs.executor --root DIR --mount-point EFS [--address ADDR]``

Why a daemon watching EFS rather than SSH from the runner: every node already shares EFS,
so publishing a job is one atomic file write, all nodes start in parallel (each polls every
~0.2 s), no private key has to exist anywhere, and the executor owns its children: each
share runs in its own process group, so stopping a job means one ``killpg`` per node, never
``pkill -f python``.

Contract (layout: ``protocol.paths.JobPaths``): for each new ``<EFS>/jobs/<id>/spec.json``
with a share for this node's address, start the share with the job's env + this node's
``DEEPLEARNING_*`` env, output to ``nodes/<rank>.log``, acknowledge in ``nodes/<rank>.started``
and record the exit in ``nodes/<rank>.exit``. On ``cancel`` (or when the runner's heartbeat
stops changing for ``orphan_timeout`` s) send SIGTERM to the share's process group, then
SIGKILL after ``grace_seconds``. Heartbeat: ``<EFS>/cluster/executors/<address>.json``, ~1 s.

This module is the daemon's loop; the work is in ``discovery`` (which jobs to start),
``shares`` (starting, supervising and stopping them), ``elastic`` (joining running elastic
jobs), ``drain`` (leaving the cluster), ``log_mirror`` (this node's job output, copied
for the CloudWatch agent) and ``gpu_sampler`` (this node's GPU metrics, in a thread of
their own).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import stat
import sys
import threading
import time
from pathlib import Path

from bootstrap_scripts.agent import imds_guard
from bootstrap_scripts.data.disks import free_mib
from bootstrap_scripts.jobs.engine import service, user_dirs
from bootstrap_scripts.jobs.executor.aws_calls import CLIENT_CONFIG
from bootstrap_scripts.jobs.executor.discovery import JobScanner
from bootstrap_scripts.jobs.executor.drain import Drain
from bootstrap_scripts.jobs.executor.elastic import ElasticJoins
from bootstrap_scripts.jobs.executor.gpu_sampler import GpuSampler
from bootstrap_scripts.jobs.executor.job_credentials import JobCredentialStore
from bootstrap_scripts.jobs.executor.log_mirror import LogMirror, share_sources
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.shares import Shares
from bootstrap_scripts.node import node_region
from bootstrap_scripts.node.single_instance import AlreadyRunning, UnsafeLockFile, acquire
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import (
    PER_USER_DIRS,
    ClusterPaths,
    NodePaths,
)
from bootstrap_scripts.protocol.records import ExecutorHeartbeat

LOG = logging.getLogger("dl-executor")

POLL_SECONDS = 0.2
HEARTBEAT_SECONDS = 1.0
#: The longest pause between passes while EFS fails (ENOSPC, I/O errors): the executor
#: keeps running and retries, each failed pass doubling the pause from ``POLL_SECONDS``.
MAX_BACKOFF_SECONDS = 5.0
#: EFS directories holding one directory per user (``jobs/``, ``managed/``,
#: ``checkpoints/``), made by root (``user_dirs``): only root creates entries in them, so
#: nobody can take another user's job id nor plant a file where another user's jobs go.
PER_USER_EFS_DIRS = tuple(PER_USER_DIRS)
PER_USER_PARENT_MODE = 0o755
#: the mode each EFS directory the executor prepares must have
EFS_DIR_MODES = dict.fromkeys(PER_USER_EFS_DIRS, PER_USER_PARENT_MODE)


def job_credential_store(root: Path, role_arn: str) -> JobCredentialStore:
    """Job role credentials made with this node's own (instance role) credentials, in its
    region (the installed file: the SDK does not ask instance metadata for it)."""
    region = node_region.client_region(root) or ""

    clients: list[object] = []
    making = threading.Lock()

    def sts() -> object:
        with making:  # called from the calls' threads (``aws_calls``): one client for all
            if not clients:  # made once, on the first job: a client costs ~0.5 s of CPU
                import boto3  # only on nodes whose stack has a job role
                from botocore.config import Config

                clients.append(boto3.client("sts", region_name=region or None,
                                            config=Config(**CLIENT_CONFIG)))
        return clients[0]

    return JobCredentialStore(NodePaths(root).job_credentials_dir, role_arn, region, sts)


def prepare_shared_dirs(efs: Path) -> list[Path]:
    """Create (or fix) the EFS directories users work in: 0755, root's, where root makes
    one directory per user (a 1777 ``jobs/`` of an older cluster becomes 0755: its old
    entries stay, never acted on, see ``user_dirs``).

    Only root may write in a new EFS file system's root directory, so without this only
    root could start a job. Done by the executor because it runs as root on every node
    from boot, once EFS is there; a directory someone else owns is left as it is (its
    owner chose its mode). Returns the directories whose mode it set."""
    changed = []
    for name, mode in EFS_DIR_MODES.items():
        path = efs / name
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        try:  # the entry itself, never what a link there points to
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # not a directory (or a link): left as it is
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
                os.fchmod(fd, mode)
                changed.append(path)
        finally:
            os.close(fd)
    return changed


class Executor:
    """One node's executor: heartbeat, scan, join, drain and supervise, every 0.2 s."""

    def __init__(self, root: Path, efs: Path, address: str = "", *, require_mount: bool = False,
                 job_role_arn: str = ""):
        self.node = ThisNode(NodePaths(root), ClusterPaths(efs), address)
        self.require_mount = require_mount
        self.shares = Shares(self.node)
        self.mirror = LogMirror(self.node.paths.root)
        self.gpu_sampler = GpuSampler(self.node.paths.root, self.identity)
        if job_role_arn:
            self.shares.credentials = job_credential_store(root, job_role_arn)
            self.shares.mounts.region = self.shares.credentials.region
        self.drain = Drain(self.node, self.shares)
        #: the executor's records for the master are signed with the node's key (node_keys)
        self.signer = self.drain.signer
        self.joins = ElasticJoins(self.node, self.shares)
        self.scanner = JobScanner(self.node, self.shares, self.joins, self.drain)
        self.started_at = time.time()
        self.seq = 0
        self.last_beat = 0.0
        self.efs_ok = True
        self.stopping = False
        self.shared_dirs_ready = False
        self.user_dirs = user_dirs.Keeper(efs)

    @property
    def efs(self) -> Path:
        return self.node.cluster.efs

    # -- identity ----------------------------------------------------------------------
    def resolve_address(self) -> str:
        """``--address``, else the node agent's env file (the agent may not have written it
        yet at boot: keep waiting rather than guessing from the network)."""
        if self.node.address:
            return self.node.address
        warned = 0.0
        while not self.stopping:
            addr = self.node.env().get("DEEPLEARNING_NODE_ADDR", "")
            if addr:
                self.node.address = addr
                return addr
            if time.monotonic() - warned > 30:
                LOG.info("waiting for %s (DEEPLEARNING_NODE_ADDR) from the node agent",
                         self.node.paths.env)
                warned = time.monotonic()
            time.sleep(POLL_SECONDS)
        return ""

    def identity(self) -> tuple[str, str] | None:
        """(cluster id, instance id) of this node from the membership it applied (None
        before it has one that lists this node): the GPU metrics' dimensions."""
        m = self.node.membership()
        me = m.node_by_address(self.node.address) if m and self.node.address else None
        return (m.cluster_id, me.instance_id) if m and me else None

    # -- heartbeat ---------------------------------------------------------------------
    def heartbeat(self, state: str = "running") -> None:
        self.seq += 1
        env = self.node.env()
        m = self.node.membership()
        record = ExecutorHeartbeat(
            address=self.node.address,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            state=state,
            seq=self.seq,
            heartbeat=time.time(),
            started_at=self.started_at,
            root=str(self.node.paths.root),
            efs_mount=str(self.efs),
            efs_mounted=os.path.ismount(self.efs),
            gpus=int(env.get("DEEPLEARNING_WORKER_GPU_COUNT", "0") or 0),
            generation=m.generation if m else 0,
            running=tuple(sorted(self.shares.running)),
            efs_ok=self.efs_ok,  # result of the previous write + read-back
            disk_free_mib=free_mib(self.node.paths.executor_state_dir),
        )
        path = self.node.cluster.executor_heartbeat(self.node.address)
        try:
            store.atomic_write(path, self.signer.signed(record.to_json()))
            back = store.read_record_or_none(path, ExecutorHeartbeat)
            self.efs_ok = bool(back and back.seq == self.seq)
        except OSError as exc:
            self.efs_ok = False
            LOG.error("cannot write heartbeat %s: %s", path, exc)
        self.last_beat = time.monotonic()

    def prepare_efs(self) -> None:
        """Once EFS is there (mounted, or a plain directory with ``--no-mount``), make the
        directories users work in (:func:`prepare_shared_dirs`), then every login user's own
        directory in them, again whenever /etc/passwd changes (``user_dirs.Keeper``)."""
        if self.require_mount and not os.path.ismount(self.efs):
            return
        try:
            if not self.shared_dirs_ready:
                for path in prepare_shared_dirs(self.efs):
                    LOG.info("%s: mode %o", path, EFS_DIR_MODES[path.name])
                self.shared_dirs_ready = True
            self.user_dirs.tick()
        except OSError as exc:
            LOG.error("cannot prepare the shared EFS directories under %s: %s", self.efs, exc)

    # -- main loop -----------------------------------------------------------------------
    def step(self) -> bool:
        """One pass: heartbeat (every ~1 s), scan, join, drain, supervise. False when EFS
        failed us (full, gone): each part is tried on its own, so a failing write (ENOSPC)
        stops neither the others nor the executor; what could not be recorded is retried
        on a later pass (:meth:`run` backs off meanwhile)."""
        ok = True
        if time.monotonic() - self.last_beat >= HEARTBEAT_SECONDS:
            self.prepare_efs()  # first: a heartbeat on EFS then means the dirs are there
            self.heartbeat()
            ok = self.efs_ok
        for what, action in (("scanning " + str(self.node.cluster.jobs_dir), self.scan),
                             ("draining", self.drain.check),
                             ("supervising the shares", self.supervise)):
            try:
                action()
            except OSError as exc:
                ok = False
                LOG.error("%s failed: %s", what, exc)
        return ok and not self.shares.unrecorded

    def scan(self) -> None:
        self.scanner.scan()
        self.joins.join(draining=self.drain.requested)

    def supervise(self) -> None:
        self.scanner.seen.update(self.shares.supervise())
        self.mirror.follow(  # the shares' output to the node's jobs log (CloudWatch)
            src for r in self.shares.running.values() for src in share_sources(
                r.paths.key, r.paths.nodes, self.node.address,
                [(r.share.rank, p.proc.label, r.paths.log(r.share.rank, p.proc.label).name)
                 for p in r.procs]))

    def run(self) -> int:
        if not self.resolve_address():
            return 0
        LOG.info("executor for %s: root %s, EFS %s", self.node.address, self.node.paths.root,
                 self.efs)
        if self.require_mount and not os.path.ismount(self.efs):
            LOG.warning("%s is not a mount point (yet); jobs will wait for it", self.efs)
        self.gpu_sampler.start()
        pause = POLL_SECONDS
        while not self.stopping:
            # EFS full or failing: retry, but do not hammer it (nor fill the log)
            pause = POLL_SECONDS if self.step() else min(pause * 2, MAX_BACKOFF_SECONDS)
            time.sleep(pause)
        self.shutdown()
        return 0

    def shutdown(self) -> None:
        """Stop every running share (TERM, then KILL after its grace) before exiting."""
        self.gpu_sampler.stop()
        with contextlib.suppress(OSError):
            self.shares.stop_all("executor stopped")
        self.shares.guards.release_all()
        self.shares.listen.release_all()
        with contextlib.suppress(OSError):
            self.heartbeat(state="stopped")


AGENT_ARGS_IGNORED = ("--role", "--cluster-id", "--stack-name", "--region", "--master-queue-url",
                      "--worker-queue-url", "--efs-id", "--wait-handle", "--setup-timeout")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dl-executor", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="/", help="node root prefix (emulator: the node's dir)")
    p.add_argument("--mount-point", default="", help="EFS mount point (default: EFS_MOUNT "
                   "from the node's env file, else /efs)")
    p.add_argument("--address", default="", help="this node's address (default: "
                   "DEEPLEARNING_NODE_ADDR from the node's env file)")
    p.add_argument("--no-mount", action="store_true",
                   help="EFS is a plain directory (emulator): do not expect a mount point")
    p.add_argument("--guard-imds", action="store_true",
                   help="before any job, let only root reach the instance metadata service "
                   "(bootstrap_scripts.agent.imds_guard)")
    p.add_argument("--job-role-arn", default="",
                   help="the stack's job role: each job gets its own temporary credentials "
                        "of it ('' = jobs get no AWS credentials)")
    # Accepted so the installer can pass the agent's argument list unchanged.
    for name in AGENT_ARGS_IGNORED:
        p.add_argument(name, default=None, help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    service.start_logging("dl-executor", verbose=args.verbose)
    root = Path(args.root)
    efs = service.efs_mount(root, args.mount_point)
    if args.guard_imds:  # no job before jobs are kept from the instance role (rules die
        try:               # with a reboot: installed again at every start)
            guarded = imds_guard.ensure()
        except imds_guard.GuardError as exc:
            LOG.error("%s; running no job", exc)
            return 1
        if guarded:
            LOG.info("only root reaches instance metadata: %s", guarded)
    try:
        lock = acquire(NodePaths(root).executor_lock)  # held (open) until we exit
    except (AlreadyRunning, UnsafeLockFile, OSError) as exc:
        LOG.error("%s; not starting a second one", exc)
        return 1
    ex = Executor(root, efs, args.address, require_mount=not args.no_mount,
                  job_role_arn=args.job_role_arn)
    service.stop_on_signals(ex)
    try:
        return ex.run()
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main())

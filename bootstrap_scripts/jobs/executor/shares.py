"""This node's shares of jobs: start one, supervise it, cancel it, record how it ended.

Each share runs in a process group of its own, and every process of it carries the share's
``DL_SHARE_TOKEN`` in its environment (torchrun moves its workers to sessions of their own,
out of the group): stopping a share is a ``killpg`` plus a signal to every process with the
token, never a search by name (:mod:`bootstrap_scripts.node.procgroup`).

A torchrun job's rendezvous store is a helper process of the master's share
(``rdzv_store.RDZV_STORE_LABEL``). Once the master's agent has succeeded, that share stays
open, its store serving, until every other share of the job has exited (or its node is
gone: :mod:`.store_hold`). A store that dies while the job runs fails the share. The
store's listening socket is bound here, as root, before any process of the share starts
(``listeners.py``): a port someone else holds fails the share at once, naming the holder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
import socket
import subprocess
import time

from bootstrap_scripts.jobs.engine import hang_rules, userfiles
from bootstrap_scripts.jobs.engine.rdzv_store import RDZV_STORE_LABEL
from bootstrap_scripts.jobs.engine.userfiles import as_user, cancel_text
from bootstrap_scripts.jobs.executor import listen_guard, listeners, oom, store_guard, store_hold
from bootstrap_scripts.jobs.executor.job_credentials import (
    CredentialsError,
    JobCredentials,
    JobCredentialStore,
    job_env,
)
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.probation import runner_beat
from bootstrap_scripts.jobs.executor.reattach import LOST_RETURNCODE, AdoptedProcess, live_group
from bootstrap_scripts.jobs.executor.running import RunningProc, RunningShare
from bootstrap_scripts.jobs.executor.s3_mounts import MountError, S3Mounts
from bootstrap_scripts.jobs.executor.share_command import (
    Launch,
    exec_errors,
    job_owner,
    job_writer,
    start_wrapped,
)
from bootstrap_scripts.node import procgroup
from bootstrap_scripts.protocol import liveness, store
from bootstrap_scripts.protocol.jobs import LISTEN_FD_VARIABLE, JobSpec, Proc, Share
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import FAULT_INFRASTRUCTURE, ShareExit, ShareStarted

LOG = logging.getLogger("dl-executor")


class Shares:
    """The shares running on this node, keyed by job key (``<user>/<job-id>``)."""

    def __init__(self, node: ThisNode) -> None:
        self.node = node
        self.running: dict[str, RunningShare] = {}
        #: exits the last :meth:`supervise` could not record (EFS full): retried next pass
        self.unrecorded = 0
        #: the job role credentials of the running jobs (None: the cluster has no job role)
        self.credentials: JobCredentialStore | None = None
        #: the jobs' ``--mount`` S3 mounts on this node (``s3_mounts.py``)
        self.mounts = S3Mounts()
        #: root's jobs whose spec the master signed (``root_jobs``; the scanner adds them);
        #: None on a node without the key, where nothing is checked
        self.root_specs: set[str] | None = None
        #: the netfilter guards that keep other users away from the jobs' stores
        self.guards = store_guard.StoreGuards(node)
        #: the nftables table that keeps other users away from whatever the jobs listen on
        self.listen = listen_guard.ListenGuard(node)

    @staticmethod
    def owner_of(uid: int, gid: int) -> tuple[str, int, int]:
        """Whose job role session a share run by ``uid`` holds: (user name, uid, gid)."""
        # (-1: the share stays who the executor is, root for root's own jobs) the session's
        # dl-user tag must be that user's name, the one dl-run put in the job's checkpoint
        # URL, else IAM refuses the job its own checkpoints
        effective = os.geteuid() if uid < 0 else uid
        try:
            user = pwd.getpwuid(effective).pw_name
        except KeyError:
            user = str(effective)
        return (user, uid, gid)

    def credentials_ready(self, paths: JobPaths) -> bool:
        """Whether the share of ``paths``'s job may start as far as its job role credentials
        go: their STS call is started on its thread (``job_credentials.begin``) and the share
        waits, pass after pass, until it has ended (or was given up as an outage); the
        executor's loop, and so the node's heartbeat, never waits on AWS."""
        if self.credentials is None or not self.credentials.enabled:
            return True
        try:
            uid, gid = job_owner(paths)
            self.credentials.begin(paths.key, *self.owner_of(uid, gid))
        except (OSError, CredentialsError):
            return True  # start() refuses the job, or starts it without, saying why
        return self.credentials.settled(paths.key)

    def issue_credentials(self, job_id: str, uid: int, gid: int
                          ) -> tuple[JobCredentials | None, tuple[str, int, int]]:
        """The job role credentials :meth:`credentials_ready` asked for (None without a job
        role), and the share's owner. CredentialsError when STS or the disk refused, with
        ``outage`` when AWS did not answer."""
        owner = self.owner_of(uid, gid)
        if self.credentials is None or not self.credentials.enabled:
            return None, owner
        return self.credentials.collect(job_id), owner

    def forget_credentials(self, job_id: str) -> None:
        """The job's share ended (or never started): its mounts and credentials go."""
        self.mounts.release(job_id)
        if self.credentials is not None:
            self.credentials.forget(job_id)

    def child_env(self, spec: JobSpec, proc: Proc, paths: JobPaths, rank: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(spec.env)
        env.update(self.node.env())  # the node's own DEEPLEARNING_* always win
        # DL_ROOT: the node's root prefix ("/" on a real node), where the node's own files
        # are (its region file: data.stage reads it); the executor's, never the job's.
        env.update({"DL_JOB_ID": spec.job_id, "DL_JOB_DIR": str(paths.dir),
                    "DL_NODE_RANK": str(rank), "DL_ROOT": str(self.node.paths.root),
                    "DL_SHARE_TOKEN": procgroup.share_token(paths.key, rank,
                                                            self.node.address)})
        env.update(proc.env)
        return env

    def start(self, spec: JobSpec, share: Share, paths: JobPaths) -> bool:
        """Start every process of ``share`` in one new process group, acknowledge it in
        ``nodes/<rank>.started``. False (and the exit recorded) if a process cannot start;
        False and nothing done if the job's spec is not safely its owner's (a link)."""
        try:
            uid, gid = job_owner(paths)
            if uid < 0 and os.geteuid() == 0 and self.root_specs is not None and \
                    paths.key not in self.root_specs:  # swapped for root's since it was read
                raise OSError("its spec is root's now, and not the one the master signed")
            self.node.user_checkpoints(uid, gid)
            with as_user(uid, gid):
                paths.nodes.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            LOG.error("job %s: refusing to start it: %s", paths.key, exc)
            return False
        started: list[RunningProc] = []
        pgid = 0
        error = ""
        outage = ""
        try:
            creds, owner = self.issue_credentials(paths.key, uid, gid)
        except (CredentialsError, OSError) as exc:
            # The job still runs (most jobs never call AWS); one that does fails with "no
            # credentials", and its log says why. AWS not answering is no answer: the
            # share does not start, an infrastructure fault that names the outage.
            creds, owner = None, ("", uid, gid)
            no_credentials = f"dl-executor: no AWS credentials for this job: {exc}\n"
            if isinstance(exc, CredentialsError) and exc.outage:
                outage, no_credentials = f"no AWS credentials for this job: {exc}", ""
            LOG.error("job %s: %s", paths.key, exc)
        else:
            no_credentials = ""
        self.node.paths.share_status_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:  # before any process starts: none may meet another user's listener
            listening, refused = ({}, outage) if outage else (
                listeners.bind_for(share, self.node.address), "")
        except listeners.ListenerRefused as exc:
            listening, refused = {}, str(exc)
        try:  # before any process starts: only the job's user may reach its store
            if not refused:
                self.guards.guard(spec, paths, uid)
                self.listen.ready()
        except (store_guard.GuardError, listen_guard.GuardError) as exc:
            refused = str(exc)
        try:  # the job's S3 mounts, made by root for its user, before any process starts
            if not refused:
                self.mounts.mount(paths.key, spec.mounts, share.rank, paths, uid, gid, creds,
                                  dict(os.environ))
        except MountError as exc:
            refused = str(exc)
        reports: list[int] = []
        for index, proc in enumerate(share.procs):
            env = job_env(self.child_env(spec, proc, paths, share.rank), creds)
            held = listening.get(index)
            if held is not None:
                env[LISTEN_FD_VARIABLE] = str(held.fileno())
            status = self.node.paths.share_status(paths.key, share.rank, index)
            with contextlib.suppress(FileNotFoundError):
                status.unlink()  # a stale one would end the share at once after a restart
            log_path = paths.log(share.rank, proc.label)
            try:
                with as_user(uid, gid):  # the user's directory: the user's rights, no link
                    log_fd = userfiles.open_append(log_path)
            except OSError as exc:  # e.g. a link planted where the log goes
                error = f"cannot open the share's log {log_path.name}: {exc}"
                break
            # the job's argv, environment and directory reach only the wrapper's child,
            # once it is the job's user (share_wrapper.py): root runs none of it
            launch = Launch(status=status, uid=uid, gid=gid, cwd=spec.cwd,
                            fallback=str(self.node.paths.root), argv=proc.argv, env=env)
            with os.fdopen(log_fd, "ab", buffering=0) as log:
                if no_credentials and index == 0:
                    log.write(no_credentials.encode())
                try:
                    if refused:
                        raise FileNotFoundError(refused)
                    popen, report = start_wrapped(
                        launch, procgroup.share_token(paths.key, share.rank,
                                                      self.node.address), log, pgid,
                        (held.fileno(),) if held is not None else ())
                except OSError as exc:
                    error = refused or f"cannot start {proc.argv[0]!r}: {exc}"
                    log.write(f"dl-executor: {error}\n".encode())
                    break
            pgid = pgid or popen.pid
            started.append(RunningProc(proc, popen))
            reports.append(report)
        # a command that could not be executed: its wrapper's child said why (in the log
        # too) and exits 127
        error = error or next((why for why in exec_errors(reports) if why), "")
        for held in listening.values():
            held.close()  # the process it was for has it now (or nobody: the start failed)
        running = RunningShare(spec, share, paths, pgid, started, time.time(), uid=uid, gid=gid,
                               owner=owner, oom_kills=oom.oom_kills())
        try:
            with as_user(uid, gid):
                store.write_record(paths.started(share.rank), ShareStarted(
                    rank=share.rank, address=self.node.address, pgid=pgid,
                    pids=tuple(p.popen.pid for p in started), started_at=running.started_at,
                    hostname=socket.gethostname(), error=error))
        except OSError as exc:
            # Unacknowledged, the share would run unseen by its runner: stop it at once.
            self.stop_unrecorded(running, f"cannot record the start of the share: {exc}")
            return False
        if error:
            LOG.error("job %s: %s", paths.key, error)
            running.signal(signal.SIGKILL)
            for p in started:
                p.popen.wait()
            fault = FAULT_INFRASTRUCTURE if outage and error == outage else ""
            self.finish(running, LOST_RETURNCODE if fault else 127, reason=error, fault=fault)
            self.forget_credentials(paths.key)
            return False
        LOG.info("job %s: started share of node rank %d (pgid %d)", paths.key, share.rank, pgid)
        self.running[paths.key] = running
        return True

    def stop_unrecorded(self, r: RunningShare, error: str) -> None:
        """A share whose start cannot be recorded (EFS full): kill it now; its exit (an
        infrastructure fault: the node failed, not the job) is recorded by
        :meth:`supervise` as soon as EFS takes writes again."""
        LOG.error("job %s: %s; stopping the share of node rank %d", r.paths.key, error,
                  r.share.rank)
        procgroup.sweep_share(r.pgid, r.token)
        for p in r.procs:
            p.popen.wait()
        r.fault, r.fault_reason = FAULT_INFRASTRUCTURE, error
        self.running[r.paths.key] = r

    def finish(self, r: RunningShare, returncode: int, *, reason: str = "",
               fault: str = "", left_alive: int = 0) -> None:
        if not (reason or r.cancel_reason or fault):  # the kernel's OOM killer, if it ran
            reason = oom.oom_reason(r.oom_kills, oom.oom_kills(), returncode)
        record = ShareExit(
            rank=r.share.rank, address=self.node.address, returncode=returncode,
            signal=-returncode if returncode < 0 else 0,
            cancelled=bool(r.cancel_reason), drained=r.drained,
            reason=reason or r.cancel_reason,
            started_at=r.started_at, finished_at=time.time(), left_alive=left_alive,
            fault=fault)
        with as_user(r.uid, r.gid):
            store.write_record(r.paths.exit(r.share.rank), record)
        for index in range(len(r.share.procs)):
            with contextlib.suppress(OSError):
                self.node.paths.share_status(r.paths.key, r.share.rank, index).unlink()
        LOG.info("job %s: node rank %d exited with %d%s", r.paths.key, r.share.rank,
                 returncode, f" ({record.reason})" if record.reason else "")

    def cancel(self, r: RunningShare, reason: str) -> None:
        if not r.cancel_reason:
            r.cancel_reason = reason
            LOG.info("job %s: stopping share (%s)", r.paths.key, reason)
        if r.term_sent is None:
            r.term_sent = time.monotonic()
            if r.drained:
                # Only torchrun (the group leader): it stops its own workers and, dying of
                # a signal, leaves the rendezvous open for the survivors. Workers hit
                # directly could be seen as failed and restarted by it first.
                procgroup.killpg(r.pgid, signal.SIGTERM)
            else:
                r.signal(signal.SIGTERM)

    def supervise(self) -> list[str]:
        """Cancel shares whose job was cancelled or whose runner went silent, SIGKILL them
        after their grace, record the exit of those that ended. Returns their job ids."""
        now = time.monotonic()
        ended = []
        self.unrecorded = 0
        for job_id, r in list(self.running.items()):
            if not r.cancel_reason:
                if (text := cancel_text(r.paths.cancel)) is not None:
                    r.stop_grace = hang_rules.stop_grace(r.spec.grace_seconds, text)
                    self.cancel(r, "cancelled by the runner")
                else:
                    verdict, r.runner_seen = liveness.runner(
                        runner_beat(r.paths), r.runner_seen, now, r.spec.orphan_timeout)
                    if verdict.gone:
                        self.cancel(r, f"runner heartbeat {verdict.value} for "
                                       f"{r.spec.orphan_timeout:.0f} s")
            if r.term_sent is not None and not r.kill_sent and \
                    now - r.term_sent > r.grace:
                LOG.info("job %s: grace period over, SIGKILL to process group %d", job_id, r.pgid)
                r.signal(signal.SIGKILL)
                r.kill_sent = True
            rdzv = r.rdzv_store()
            if rdzv is not None and not r.cancel_reason and not r.main_done() and \
                    rdzv.popen.poll() is not None:
                self.cancel(r, f"the job's rendezvous store exited with code "
                               f"{rdzv.popen.returncode} (its log: "
                               f"{r.paths.log(r.share.rank, RDZV_STORE_LABEL).name})")
            if r.main_done() and store_hold.holding_store(self.node, r, now):
                continue
            if r.main_done():
                rc = r.returncode() if not r.cancel_reason else (r.returncode() or -signal.SIGTERM)
                # Leftovers (helpers, grandchildren, torchrun workers in their own
                # sessions when torchrun died first) must not outlive the share.
                for p in r.procs:
                    if p.popen.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            p.popen.kill()
                left = procgroup.sweep_share(r.pgid, r.token)
                for p in r.procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.popen.wait(timeout=5)
                if left:
                    LOG.error("job %s: processes %s survived SIGKILL", job_id, left)
                fault, why = r.infrastructure_fault()
                try:
                    self.finish(r, LOST_RETURNCODE if fault else rc, fault=fault, reason=why)
                except OSError as exc:  # e.g. EFS full: keep it, record it on a later pass
                    LOG.error("job %s: cannot record the exit of node rank %d (%d), will "
                              "retry: %s", job_id, r.share.rank, rc, exc)
                    self.unrecorded += 1
                    continue
                del self.running[job_id]
                self.forget_credentials(job_id)
                ended.append(job_id)
        self.guards.tick(set(self.running), now)
        self.listen.tick({r.token: r.uid if r.uid >= 0 else os.geteuid()
                          for r in self.running.values()}, now)
        if self.credentials is not None and self.credentials.enabled:
            self.credentials.refresh_due({j: r.owner for j, r in self.running.items()
                                          if r.owner[1] >= 0})
        return ended

    def stop_all(self, reason: str) -> None:
        """Stop every running share (TERM, then KILL after its grace) and record the exits."""
        for r in self.running.values():
            self.cancel(r, reason)
        grace = max([r.spec.grace_seconds for r in self.running.values()] + [0])
        deadline = time.monotonic() + grace
        while self.running and time.monotonic() < deadline + 5:
            self.supervise()
            time.sleep(0.05)
        for r in list(self.running.values()):
            r.signal(signal.SIGKILL)
        self.supervise()

    def reattach(self, spec: JobSpec, share: Share, paths: JobPaths) -> None:
        """Supervise again a share this node started before the executor restarted
        (``.started`` without ``.exit``): its processes carry on, their exits are
        collected from their wrappers' status files (:mod:`reattach`)."""
        token = procgroup.share_token(paths.key, share.rank, self.node.address)
        uid, gid = job_writer(paths)
        rec = userfiles.read_record_or_none(paths.started(share.rank), ShareStarted)
        pids = rec.pids if rec else ()
        procs = [RunningProc(proc, AdoptedProcess(
                     pid, token, self.node.paths.share_status(paths.key, share.rank, index)))
                 for index, (proc, pid) in enumerate(zip(share.procs, pids, strict=False))]
        r = RunningShare(spec, share, paths, live_group(rec.pgid if rec else 0, token), procs,
                         rec.started_at if rec else time.time(), uid=uid, gid=gid)
        if not procs:  # nothing to follow: the node lost the share, the job did not fail
            left = procgroup.sweep_share(r.pgid, token)
            self.finish(r, LOST_RETURNCODE, fault=FAULT_INFRASTRUCTURE, left_alive=len(left),
                        reason="the job executor restarted and found no record of the "
                               "share's processes")
            return
        try:  # the kernel kept its guard; this executor holds it from now on
            self.guards.guard(spec, paths, uid)
        except store_guard.GuardError as exc:
            LOG.error("job %s: cannot guard its rendezvous store after re-attaching: %s",
                      paths.key, exc)
        # the previous executor's credentials were in its memory: new ones are asked for
        # (on their thread), written when STS answers (``refresh_due`` collects them)
        r.owner = self.owner_of(uid, gid)
        if self.credentials is not None and self.credentials.enabled and uid >= 0:
            try:
                self.credentials.begin(paths.key, *r.owner)
            except CredentialsError as exc:
                LOG.error("job %s: no job role credentials after re-attaching: %s",
                          paths.key, exc)
        self.running[paths.key] = r
        LOG.warning("job %s: re-attached to the share of node rank %d left running by a "
                    "previous executor (pgid %d, pids %s)", paths.key, share.rank, r.pgid,
                    [p.popen.pid for p in procs])

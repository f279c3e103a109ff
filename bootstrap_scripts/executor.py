"""Per-node job executor: starts this node's share of every job ``dl-run`` publishes on EFS.

``python3 -m bootstrap_scripts.executor --root DIR --mount-point EFS [--address ADDR]``

Why a daemon watching EFS rather than SSH from the runner: every node already shares EFS,
so publishing a job is one atomic file write, all nodes start in parallel (each polls every
~0.2 s), no private key has to exist anywhere, and the executor owns its children: each
share runs in its own process group, so stopping a job means one ``killpg`` per node, never
``pkill -f python``.

Contract (see ``job_spec`` for the layout): for each new ``<EFS>/jobs/<id>/spec.json`` with
a share for this node's address, start the share with the job's env + this node's
``DEEPLEARNING_*`` env, output to ``nodes/<rank>.log``, acknowledge in ``nodes/<rank>.started``
and record the exit in ``nodes/<rank>.exit``. On ``cancel`` (or when the runner's heartbeat
stops changing for ``orphan_timeout`` s) send SIGTERM to the share's process group, then
SIGKILL after ``grace_seconds``. Heartbeat: ``<EFS>/cluster/executors/<address>.json``, ~1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts import job_spec as js
from bootstrap_scripts.membership import ENV_FILE, MEMBERSHIP_FILE, Membership, parse_env_file

LOG = logging.getLogger("dl-executor")

POLL_SECONDS = 0.2
HEARTBEAT_SECONDS = 1.0
#: A job found at start-up is only started if its runner proves alive within this time
#: (its heartbeat changes): a node rebooting must not replay old jobs.
STARTUP_LIVENESS_SECONDS = 3.0
#: A job directory with no spec.json after this long is a dry run or a crashed runner.
SPECLESS_GIVE_UP_SECONDS = 60.0


@dataclass
class RunningProc:
    proc: js.Proc
    popen: subprocess.Popen


@dataclass
class RunningShare:
    spec: js.JobSpec
    share: js.Share
    jdir: Path
    pgid: int
    procs: list[RunningProc]
    started_at: float
    runner_beat: str | None = None
    runner_beat_changed: float = field(default_factory=time.monotonic)
    cancel_reason: str = ""
    term_sent: float | None = None
    kill_sent: bool = False
    drained: bool = False

    @property
    def token(self) -> str:
        return share_token(self.spec.job_id, self.share.rank, self.share.address)

    def signal(self, sig: int) -> None:
        if self.pgid:
            signal_share(self.pgid, self.token, sig)

    def main_done(self) -> bool:
        return all(p.popen.poll() is not None for p in self.procs if p.proc.wait)

    def all_done(self) -> bool:
        return all(p.popen.poll() is not None for p in self.procs)

    def returncode(self) -> int:
        for p in self.procs:
            if p.proc.wait and p.popen.returncode not in (0, None):
                return p.popen.returncode
        return 0


def read_node_env(root: Path) -> dict[str, str]:
    try:
        return parse_env_file((root / ENV_FILE).read_text())
    except OSError:
        return {}


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def share_token(job_id: str, rank: int, address: str) -> str:
    return f"{job_id}/{rank}/{address}"


def pids_with_token(token: str) -> list[int]:
    """Processes whose environment carries ``DL_SHARE_TOKEN=<token>``.

    A process group is not enough: torchrun starts every worker in a NEW session, so when
    the agent is killed its workers would survive outside the share's group. Every
    descendant inherits the token (unless it clears its environment), whatever its group,
    session or parent is now; the token includes the node address, so emulated nodes on
    one machine never touch each other's processes."""
    needle = b"\0DL_SHARE_TOKEN=" + token.encode() + b"\0"
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if needle in b"\0" + data + b"\0":
            found.append(int(entry))
    return found


def _safe_getpgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def signal_share(pgid: int, token: str, sig: int) -> None:
    killpg(pgid, sig)
    for pid in pids_with_token(token):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def sweep_share(pgid: int, token: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL the share's group and every process carrying its token, again and again
    until none is left (or ``timeout``): a dying torchrun may still be starting workers
    when the first sweep runs, and its workers live in sessions of their own, so they
    survive it. Works whether or not the torchrun parent is still there. Returns the PIDs
    still alive at the end (normally none)."""
    deadline = time.monotonic() + timeout
    while True:
        if pgid:
            killpg(pgid, signal.SIGKILL)
        left = [pid for pid in pids_with_token(token) if _alive(pid)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Live and not a zombie (a zombie child of ours still shows its environ)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Executor:
    def __init__(self, root: Path, efs: Path, address: str = "", *, require_mount: bool = False):
        self.root = root
        self.efs = efs
        self.address = address
        self.require_mount = require_mount
        self.running: dict[str, RunningShare] = {}
        self.seen: set[str] = set()
        self.pending: dict[str, tuple[str | None, float]] = {}  # pre-existing jobs on probation
        self.specless: dict[str, float] = {}
        self.first_scan = True
        self.started_at = time.time()
        self.seq = 0
        self.last_beat = 0.0
        self.efs_ok = True
        self.stopping = False
        #: elastic jobs without a share for this node: re-checked when the generation moves
        self.elastic_waiting: dict[str, tuple[js.JobSpec, Path]] = {}
        #: set once ``cluster/drain/<instance-id>.json`` names this node: (id, request)
        self.drain: tuple[str, dict] | None = None
        self.drain_done = False

    # -- identity ----------------------------------------------------------------------
    def resolve_address(self) -> str:
        """``--address``, else the node agent's env file (the agent may not have written it
        yet at boot: keep waiting rather than guessing from the network)."""
        if self.address:
            return self.address
        warned = 0.0
        while not self.stopping:
            addr = read_node_env(self.root).get("DEEPLEARNING_NODE_ADDR", "")
            if addr:
                self.address = addr
                return addr
            if time.monotonic() - warned > 30:
                LOG.info("waiting for %s (DEEPLEARNING_NODE_ADDR) from the node agent",
                         self.root / ENV_FILE)
                warned = time.monotonic()
            time.sleep(POLL_SECONDS)
        return ""

    # -- heartbeat ---------------------------------------------------------------------
    def heartbeat(self, state: str = "running") -> None:
        self.seq += 1
        env = read_node_env(self.root)
        try:
            generation = Membership.load(self.root / MEMBERSHIP_FILE).generation
        except (OSError, ValueError):
            generation = 0
        record = {
            "address": self.address,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "state": state,
            "seq": self.seq,
            "heartbeat": time.time(),
            "started_at": self.started_at,
            "root": str(self.root),
            "efs_mount": str(self.efs),
            "efs_mounted": os.path.ismount(self.efs),
            "gpus": int(env.get("DEEPLEARNING_WORKER_GPU_COUNT", "0") or 0),
            "generation": generation,
            "running": sorted(self.running),
            "efs_ok": self.efs_ok,  # result of the previous write + read-back
        }
        path = js.executor_heartbeat_path(self.efs, self.address)
        try:
            js.write_json_atomic(path, record)
            back = js.read_json(path)
            self.efs_ok = bool(back and back.get("seq") == self.seq)
        except OSError as exc:
            self.efs_ok = False
            LOG.error("cannot write heartbeat %s: %s", path, exc)
        self.last_beat = time.monotonic()

    # -- job discovery -----------------------------------------------------------------
    def scan(self) -> None:
        try:
            entries = [e.name for e in os.scandir(js.jobs_dir(self.efs)) if e.is_dir()]
        except FileNotFoundError:
            entries = []
        now = time.monotonic()
        for job_id in entries:
            if job_id in self.seen or job_id in self.running or job_id.startswith("."):
                continue
            jdir = self.efs / js.EFS_JOBS_DIR / job_id
            if (jdir / "done").exists() or (jdir / "cancel").exists():
                self.seen.add(job_id)
                continue
            try:
                spec = js.JobSpec.from_json((jdir / "spec.json").read_text())
            except FileNotFoundError:
                first = self.specless.setdefault(job_id, now)
                if now - first > SPECLESS_GIVE_UP_SECONDS:
                    self.seen.add(job_id)
                continue
            except (OSError, js.JobSpecError) as exc:
                LOG.error("job %s: unreadable spec, ignoring it: %s", job_id, exc)
                self.seen.add(job_id)
                continue
            share = spec.share_for(self.address) or self._joined_share(spec, jdir)
            if share is None and spec.elastic and spec.join_template is not None:
                self.elastic_waiting[job_id] = (spec, jdir)
                self.seen.add(job_id)
                continue
            if share is not None and js.started_path(jdir, share.rank).exists() and \
                    not js.exit_path(jdir, share.rank).exists() and self.first_scan:
                self.clean_up_orphan(spec, share, jdir)
            if share is None or js.exit_path(jdir, share.rank).exists() or \
                    js.started_path(jdir, share.rank).exists():
                self.seen.add(job_id)
                continue
            if self.drain is not None:
                self.seen.add(job_id)  # leaving the cluster: no new work
                continue
            if self.first_scan or job_id in self.pending:
                beat = self._runner_beat(jdir)
                prev = self.pending.setdefault(job_id, (beat, now))
                if beat == prev[0]:
                    if now - prev[1] > STARTUP_LIVENESS_SECONDS:
                        LOG.info("job %s: runner not alive, not starting it", job_id)
                        self.seen.add(job_id)
                        self.pending.pop(job_id, None)
                    continue
                self.pending.pop(job_id, None)
            self.start(spec, share, jdir)
        self.first_scan = False
        self.join_elastic()

    # -- elastic jobs (protocol §7) ------------------------------------------------------
    def _joined_share(self, spec: js.JobSpec, jdir: Path) -> js.Share | None:
        """The share this node claimed in an elastic job earlier (an executor restart)."""
        if not spec.elastic:
            return None
        for claim in js.nodes_dir(jdir).glob("*.claim"):
            rec = js.read_json(claim) or {}
            if rec.get("address") == self.address and spec.join_template is not None:
                from bootstrap_scripts.launchers import join_share

                return join_share(spec.join_template, int(rec["rank"]), self.address)
        return None

    def current_generation(self) -> tuple[int, list[str]]:
        try:
            m = Membership.load(self.root / MEMBERSHIP_FILE)
        except (OSError, ValueError):
            return 0, []
        return m.generation, [n.address for n in m.nodes]

    def join_elastic(self) -> None:
        """Start this node's share of every running elastic job whose start predates the
        generation that added this node: torchrun's c10d rendezvous admits the new agent,
        the others restart their workers, which resume from the latest step checkpoint."""
        if not self.elastic_waiting or self.drain is not None:
            return
        generation, addresses = self.current_generation()
        for job_id, (spec, jdir) in list(self.elastic_waiting.items()):
            if (jdir / "done").exists() or (jdir / "cancel").exists():
                del self.elastic_waiting[job_id]
                continue
            if generation <= spec.generation or self.address not in addresses:
                continue
            beat = self._runner_beat(jdir)
            key = f"elastic:{job_id}"
            prev = self.pending.setdefault(key, (beat, time.monotonic()))
            if beat == prev[0]:  # the runner must be alive: never join a dead job
                if time.monotonic() - prev[1] > max(STARTUP_LIVENESS_SECONDS,
                                                     spec.orphan_timeout):
                    LOG.info("job %s: runner not alive, not joining it", job_id)
                    del self.elastic_waiting[job_id]
                continue
            self.pending.pop(key, None)
            del self.elastic_waiting[job_id]
            rank = self.claim_rank(spec, jdir, generation)
            from bootstrap_scripts.launchers import join_share

            assert spec.join_template is not None
            share = join_share(spec.join_template, rank, self.address)
            LOG.info("job %s: joining the elastic job as node rank %d (generation %d > %d)",
                     job_id, rank, generation, spec.generation)
            self.start(spec, share, jdir)

    def claim_rank(self, spec: js.JobSpec, jdir: Path, generation: int) -> int:
        """The first free share rank after the spec's, claimed with O_EXCL: several nodes
        may join at once and no coordinator hands out numbers."""
        nodes = js.nodes_dir(jdir)
        nodes.mkdir(parents=True, exist_ok=True)
        rank = max(s.rank for s in spec.shares) + 1
        while True:
            try:
                fd = os.open(js.claim_path(jdir, rank), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                             0o644)
            except FileExistsError:
                rank += 1
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump({"rank": rank, "address": self.address, "generation": generation,
                           "claimed_at": time.time()}, fh)
            return rank

    def check_drain(self) -> None:
        """A drain request naming this node's address: stop every share (SIGTERM to
        torchrun, which stops its workers WITHOUT closing the rendezvous for the others;
        SIGKILL after the grace), start nothing new, then write ``<instance-id>.done``."""
        if self.drain is None:
            try:
                names = [e.name for e in os.scandir(js.drain_dir(self.efs))
                         if e.name.endswith(".json")]
            except FileNotFoundError:
                return
            for name in names:
                req = js.read_json(js.drain_dir(self.efs) / name)
                if req and req.get("address") == self.address:
                    self.drain = (name[:-5], req)
                    LOG.info("drain requested for %s (%s): stopping %d share(s)",
                             name[:-5], self.address, len(self.running))
                    break
            else:
                return
        for r in self.running.values():
            if not r.cancel_reason:
                r.drained = True
                self.cancel(r, "drained: node leaving the cluster")
        if not self.running and not self.drain_done:
            instance_id, req = self.drain
            js.write_json_atomic(js.drain_done_path(self.efs, instance_id), {
                "instance_id": instance_id, "address": self.address,
                "requested_at": req.get("requested_at"), "done_at": time.time(),
                "executor_pid": os.getpid()})
            self.drain_done = True
            LOG.info("drain of %s done: no share running", instance_id)

    def clean_up_orphan(self, spec: js.JobSpec, share: js.Share, jdir: Path) -> None:
        """A share this node started before the executor restarted (``.started`` without
        ``.exit``): its processes are not our children any more and nobody records their
        exit, so stop them all (by token) and record why. The runner sees a clear exit."""
        token = share_token(spec.job_id, share.rank, self.address)
        rec = js.read_json(js.started_path(jdir, share.rank)) or {}
        pgid = int(rec.get("pgid") or 0)
        if pgid and not any(_safe_getpgid(p) == pgid for p in pids_with_token(token)):
            pgid = 0  # the group is gone (its number may belong to someone else now)
        left = sweep_share(pgid, token)
        js.write_json_atomic(js.exit_path(jdir, share.rank), {
            "rank": share.rank, "address": self.address, "returncode": -signal.SIGKILL,
            "signal": signal.SIGKILL, "cancelled": True, "drained": False,
            "reason": "the job executor restarted; the share it found running was stopped",
            "started_at": rec.get("started_at"), "finished_at": time.time(),
            "left_alive": left})
        LOG.warning("job %s: stopped the orphaned share of node rank %d left by a previous "
                    "executor%s", spec.job_id, share.rank, f" ({left} still alive)" if left
                    else "")

    @staticmethod
    def _runner_beat(jdir: Path) -> str | None:
        try:
            return (jdir / "runner.json").read_text()
        except OSError:
            return None

    # -- starting and stopping shares -----------------------------------------------------
    def child_env(self, spec: js.JobSpec, proc: js.Proc, jdir: Path, rank: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(spec.env)
        env.update(read_node_env(self.root))  # the node's own DEEPLEARNING_* always win
        env.update({"DL_JOB_ID": spec.job_id, "DL_JOB_DIR": str(jdir), "DL_NODE_RANK": str(rank),
                    "DL_SHARE_TOKEN": share_token(spec.job_id, rank, self.address)})
        env.update(proc.env)
        return env

    def start(self, spec: js.JobSpec, share: js.Share, jdir: Path) -> None:
        nodes = js.nodes_dir(jdir)
        nodes.mkdir(parents=True, exist_ok=True)
        cwd = spec.cwd if spec.cwd and os.path.isdir(spec.cwd) else str(self.root)
        started: list[RunningProc] = []
        pgid = 0
        as_user = self.job_owner(jdir)
        error = ""
        for proc in share.procs:
            log_path = nodes / js.log_name(share.rank, proc.label)
            with open(log_path, "ab", buffering=0) as log:
                try:
                    popen = subprocess.Popen(
                        list(proc.argv), cwd=cwd, env=self.child_env(spec, proc, jdir, share.rank),
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        **({"process_group": pgid} if pgid else {"start_new_session": True}),
                        **as_user,
                    )
                except OSError as exc:
                    error = f"cannot start {proc.argv[0]!r}: {exc}"
                    log.write(f"dl-executor: {error}\n".encode())
                    break
            pgid = pgid or popen.pid
            started.append(RunningProc(proc, popen))
        running = RunningShare(spec, share, jdir, pgid, started, time.time(),
                               runner_beat=self._runner_beat(jdir))
        js.write_json_atomic(js.started_path(jdir, share.rank), {
            "rank": share.rank, "address": self.address, "pgid": pgid,
            "pids": [p.popen.pid for p in started], "started_at": running.started_at,
            "hostname": socket.gethostname(), "error": error,
        })
        if error:
            LOG.error("job %s: %s", spec.job_id, error)
            running.signal(signal.SIGKILL)
            for p in started:
                p.popen.wait()
            self.finish(running, 127, reason=error)
            self.seen.add(spec.job_id)
            return
        LOG.info("job %s: started share of node rank %d (pgid %d)", spec.job_id, share.rank, pgid)
        self.running[spec.job_id] = running

    @staticmethod
    def job_owner(jdir: Path) -> dict:
        """Jobs run as the user who published them (the owner of spec.json), not as the
        executor's root: a user must not gain root on every node by submitting a job."""
        if os.geteuid() != 0:
            return {}
        st = (jdir / "spec.json").stat()
        if st.st_uid == 0:
            return {}
        return {"user": st.st_uid, "group": st.st_gid, "extra_groups": []}

    def finish(self, r: RunningShare, returncode: int, *, reason: str = "") -> None:
        record = {
            "rank": r.share.rank, "address": self.address, "returncode": returncode,
            "signal": -returncode if returncode < 0 else 0,
            "cancelled": bool(r.cancel_reason), "drained": r.drained,
            "reason": reason or r.cancel_reason,
            "started_at": r.started_at, "finished_at": time.time(),
        }
        js.write_json_atomic(js.exit_path(r.jdir, r.share.rank), record)
        LOG.info("job %s: node rank %d exited with %d%s", r.spec.job_id, r.share.rank,
                 returncode, f" ({record['reason']})" if record["reason"] else "")

    def cancel(self, r: RunningShare, reason: str) -> None:
        if not r.cancel_reason:
            r.cancel_reason = reason
            LOG.info("job %s: stopping share (%s)", r.spec.job_id, reason)
        if r.term_sent is None:
            r.term_sent = time.monotonic()
            if r.drained:
                # Only torchrun (the group leader): it stops its own workers and, dying of
                # a signal, leaves the rendezvous open for the survivors. Workers hit
                # directly could be seen as failed and restarted by it first.
                killpg(r.pgid, signal.SIGTERM)
            else:
                r.signal(signal.SIGTERM)

    def supervise(self) -> None:
        now = time.monotonic()
        for job_id, r in list(self.running.items()):
            if not r.cancel_reason:
                if (r.jdir / "cancel").exists():
                    self.cancel(r, "cancelled by the runner")
                else:
                    beat = self._runner_beat(r.jdir)
                    if beat != r.runner_beat:
                        r.runner_beat, r.runner_beat_changed = beat, now
                    elif now - r.runner_beat_changed > r.spec.orphan_timeout:
                        self.cancel(r, f"runner heartbeat stale for {r.spec.orphan_timeout:.0f} s")
            if r.term_sent is not None and not r.kill_sent and \
                    now - r.term_sent > r.spec.grace_seconds:
                LOG.info("job %s: grace period over, SIGKILL to process group %d", job_id, r.pgid)
                r.signal(signal.SIGKILL)
                r.kill_sent = True
            if r.main_done():
                rc = r.returncode() if not r.cancel_reason else (r.returncode() or -signal.SIGTERM)
                # Leftovers (helpers, grandchildren, torchrun workers in their own
                # sessions when torchrun died first) must not outlive the share.
                for p in r.procs:
                    if p.popen.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            p.popen.kill()
                left = sweep_share(r.pgid, r.token)
                for p in r.procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.popen.wait(timeout=5)
                if left:
                    LOG.error("job %s: processes %s survived SIGKILL", job_id, left)
                self.finish(r, rc)
                del self.running[job_id]
                self.seen.add(job_id)

    # -- main loop -----------------------------------------------------------------------
    def run(self) -> int:
        if not self.resolve_address():
            return 0
        LOG.info("executor for %s: root %s, EFS %s", self.address, self.root, self.efs)
        if self.require_mount and not os.path.ismount(self.efs):
            LOG.warning("%s is not a mount point (yet); jobs will wait for it", self.efs)
        while not self.stopping:
            if time.monotonic() - self.last_beat >= HEARTBEAT_SECONDS:
                self.heartbeat()
            try:
                self.scan()
            except OSError as exc:
                LOG.error("scanning %s failed: %s", js.jobs_dir(self.efs), exc)
            self.check_drain()
            self.supervise()
            time.sleep(POLL_SECONDS)
        self.shutdown()
        return 0

    def shutdown(self) -> None:
        """Stop every running share (TERM, then KILL after its grace) before exiting."""
        for r in self.running.values():
            self.cancel(r, "executor stopped")
        grace = max([r.spec.grace_seconds for r in self.running.values()] + [0])
        deadline = time.monotonic() + grace
        while self.running and time.monotonic() < deadline + 5:
            self.supervise()
            time.sleep(0.05)
        for r in list(self.running.values()):
            r.signal(signal.SIGKILL)
        self.supervise()
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
    # Accepted so the installer can pass the agent's argument list unchanged.
    for name in AGENT_ARGS_IGNORED:
        p.add_argument(name, default=None, help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s dl-executor %(levelname)s %(message)s")
    root = Path(args.root)
    efs = args.mount_point or read_node_env(root).get("EFS_MOUNT", "") or "/efs"
    ex = Executor(root, Path(efs), args.address, require_mount=not args.no_mount)

    def stop(signum: int, _frame: object) -> None:
        ex.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return ex.run()


if __name__ == "__main__":
    sys.exit(main())

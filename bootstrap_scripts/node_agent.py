"""The node agent: runs on every cluster node (systemd ``dl-agent.service``).

At boot it learns who it is (IMDSv2), mounts EFS, counts its GPUs and registers on EFS.
Then:

- the **master** long-polls the master queue for the Lambda's ``asg-setup`` messages
  (protocol.md §3), builds the membership from both groups once both are set up, publishes
  it on EFS as generation 1, applies it locally and signals the wait condition; afterwards
  every ``asg-setup``/``membership-change`` message (and a periodic resync) re-reads the
  groups and publishes a new generation when the node list changed;
- a **worker** watches ``<EFS>/cluster/membership.json`` (every ~0.25 s) and applies every
  newer generation that lists it.

Elastic membership (protocol.md §7, docs/elastic.md): with ``--data-prep`` every node runs
that command before it may join and records ``cluster/prepared/<id>.ok|.failed``; after
formation the master adds only registered (and prepared) nodes, drains workers on
``drain-request`` (drain file, new generation without the node, wait for ``.done`` or the
deadline, then CompleteLifecycleAction CONTINUE), and keeps itself and the base workers
protected from scale-in.

The worker SQS queue is deliberately unused: SQS delivers each message to ONE consumer, so
it cannot broadcast; the original faked a broadcast with visibility timeout 0 and never
deleting, which made every worker re-read stale messages forever. EFS already is the
shared, consistent medium every node mounts, so the membership lives there.

Everything configurable comes from the command line (protocol.md §4), so the local
emulator runs this same entry point with ``--root <node dir> --no-mount``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bootstrap_scripts import agent_log
from bootstrap_scripts import cluster_discovery as disco
from bootstrap_scripts import membership as ms
from bootstrap_scripts import shared_state as shared
from bootstrap_scripts import wait_condition as wc
from bootstrap_scripts.efs_mount import MountError, ensure_mounted
from bootstrap_scripts.gpus import count_gpus
from bootstrap_scripts.identity import IdentityError, NodeIdentity, fetch_identity
from bootstrap_scripts.messages import (
    AsgSetup,
    BadMessage,
    DrainRequest,
    MembershipChange,
    parse_message,
)
from bootstrap_scripts.node_files import apply_membership

#: Exit status for a definite failure already reported (systemd must not restart it).
EXIT_FAILED = 2
#: Local (per-instance) agent state: survives an agent restart, never shared across nodes.
STATE_FILE = "var/lib/dl-agent/state.json"
#: Seconds the master polls every second while a node's GPU count is still a guess.
FAST_POLL_WINDOW = 600.0
#: Longest SQS wait of a formed master: it also looks for nodes that registered without any
#: Auto Scaling message (an instance started by hand from the worker launch template).
JOIN_POLL_SECONDS = 5
#: Attempts at CompleteLifecycleAction before leaving it to the hook's default (CONTINUE).
COMPLETE_ATTEMPTS = 5


@dataclass
class AgentConfig:
    role: str
    cluster_id: str
    stack_name: str
    region: str
    master_queue_url: str
    worker_queue_url: str = ""
    efs_id: str = ""
    mount_point: str = "/efs"
    wait_handle: str = ""
    setup_timeout: float = 3300.0
    root: str = "/"
    no_mount: bool = False
    poll_wait: int = 20
    watch_interval: float = 0.25
    heartbeat_interval: float = 5.0
    registration_wait: float = 60.0
    mount_timeout: float = 900.0
    resync_interval: float = 300.0
    nvidia_smi: str = "nvidia-smi"
    data_prep: str = ""
    data_prep_timeout: float = 3300.0
    base_workers: int = -1
    drain_timeout: float = 240.0

    def __post_init__(self) -> None:
        if self.role not in ("master", "worker"):
            raise ValueError(f"--role must be master or worker, got {self.role!r}")
        if not self.cluster_id:
            raise ValueError("--cluster-id must not be empty")
        if self.role == "master" and not self.master_queue_url:
            raise ValueError("--master-queue-url is required on the master")
        if not 0 <= self.poll_wait <= 20:
            raise ValueError(f"--poll-wait must be 0..20 (SQS limit), got {self.poll_wait}")
        if self.setup_timeout <= 0:
            raise ValueError(f"--setup-timeout must be positive, got {self.setup_timeout}")
        if self.drain_timeout <= 0:
            raise ValueError(f"--drain-timeout must be positive, got {self.drain_timeout}")
        if self.data_prep_timeout <= 0:
            raise ValueError(
                f"--data-prep-timeout must be positive, got {self.data_prep_timeout}")
        if self.base_workers < -1:
            raise ValueError(f"--base-workers must be >= 0 (or -1: all), got {self.base_workers}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dl-agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--role", required=True, choices=["master", "worker"])
    p.add_argument("--cluster-id", required=True)
    p.add_argument("--stack-name", required=True)
    p.add_argument("--region", required=True)
    p.add_argument("--master-queue-url", default="")
    p.add_argument("--worker-queue-url", default="",
                   help="accepted for compatibility; unused (SQS cannot broadcast)")
    p.add_argument("--efs-id", default="")
    p.add_argument("--mount-point", default="/efs")
    p.add_argument("--wait-handle", default="", help="presigned URL; '' = nothing to signal")
    p.add_argument("--setup-timeout", type=float, default=3300.0,
                   help="seconds the master waits for both groups (default 3300)")
    p.add_argument("--root", default="/", help="prefix for node files (emulator/tests)")
    p.add_argument("--no-mount", action="store_true",
                   help="treat --mount-point as a plain shared directory (emulator/tests)")
    p.add_argument("--poll-wait", type=int, default=20, help="SQS long-poll seconds (0..20)")
    p.add_argument("--watch-interval", type=float, default=0.25,
                   help="seconds between checks of the EFS membership (workers)")
    p.add_argument("--heartbeat-interval", type=float, default=5.0)
    p.add_argument("--registration-wait", type=float, default=60.0,
                   help="seconds the master waits for nodes to register before forming")
    p.add_argument("--mount-timeout", type=float, default=900.0)
    p.add_argument("--resync-interval", type=float, default=300.0,
                   help="master re-reads the groups this often even without messages")
    p.add_argument("--nvidia-smi", default="nvidia-smi")
    p.add_argument("--data-prep", default="",
                   help="shell command every node runs before it joins ('' = none)")
    p.add_argument("--data-prep-timeout", type=float, default=3300.0,
                   help="seconds the data-preparation command may run (default 3300)")
    p.add_argument("--base-workers", type=int, default=-1,
                   help="master: workers protected from scale-in (-1 = all at formation)")
    p.add_argument("--drain-timeout", type=float, default=240.0,
                   help="master: seconds a drained node gets to stop its job shares "
                        "(below the lifecycle hook's 300 s heartbeat)")
    return p


def config_from_args(argv: list[str] | None = None) -> AgentConfig:
    ns = build_parser().parse_args(argv)
    return AgentConfig(**{k: v for k, v in vars(ns).items()})


class SetupFailed(RuntimeError):
    """The cluster cannot form; the message is the wait-condition reason."""


@dataclass
class MasterState:
    """What the master remembers across an agent restart (local disk, this instance only)."""

    setup_started: float = 0.0
    setup: dict[str, dict] = field(default_factory=dict)  # role -> asg-setup message


class NodeAgent:
    """One node's agent. ``run()`` blocks until ``stop_event`` is set or setup fails."""

    def __init__(self, config: AgentConfig, *, identity: NodeIdentity | None = None,
                 stop_event: threading.Event | None = None) -> None:
        self.config = config
        self.identity = identity
        self.stop = stop_event or threading.Event()
        self.log = agent_log.agent_logger("starting")
        self.efs = Path(config.mount_point)
        self.root = Path(config.root)
        self.gpus = 0
        self.started_at = time.time()
        self.applied_generation = 0
        self.current: ms.Membership | None = None
        self._file_handler: logging.Handler | None = None
        self._registration_lock = threading.Lock()
        self._sqs = self._ec2 = self._autoscaling = None
        self._clients_thread: threading.Thread | None = None
        #: True only while blocked in an SQS long poll, where stopping at once is safe: a
        #: message received but not yet processed is simply delivered again later.
        self.interruptible = False
        self.formed = threading.Event()
        #: nodes whose GPU count we guessed (not registered yet): re-checked until they are.
        self._fallback_gpus: set[str] = set()
        self._fast_poll_until = 0.0
        #: master: drains in progress (instance id -> drain record), see protocol.md §7.
        self._drains: dict[str, dict] = {}
        #: master: live workers waiting to join (not registered / not prepared yet).
        self._pending_join: set[str] = set()
        self._seen_registrations: set[str] = set()
        self._prep_failed_logged: set[str] = set()
        self._group_names: dict[str, str] = {}
        self._group_members: set[str] = set()
        self._base_target: int | None = None
        #: worker: this node is being drained (stop heartbeating: it is leaving).
        self.draining = False

    # -- lifecycle -----------------------------------------------------------------------
    def run(self) -> int:
        if self.config.role == "master":
            # Creating boto3 clients takes ~0.5 s of CPU: overlap it with identity and mount.
            self._clients_thread = threading.Thread(target=self._clients, daemon=True,
                                                    name="aws-clients")
            self._clients_thread.start()
        try:
            self._boot()
        except (IdentityError, MountError) as exc:
            self.log.error("event=boot-failed error=%s", exc)
            if self.config.role == "master":
                self._signal(wc.FAILURE, f"node agent could not start: {exc}")
            return EXIT_FAILED
        heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                     name=f"heartbeat-{self.identity.instance_id}")
        heartbeat.start()
        try:
            if self.config.role == "master":
                return self._run_master()
            return self._run_worker()
        except SetupFailed as exc:
            self.log.error("event=setup-failed reason=%r", str(exc))
            self._signal(wc.FAILURE, str(exc))
            return EXIT_FAILED
        finally:
            self.stop.set()
            heartbeat.join(timeout=5)
            if self._file_handler is not None:
                self.log.removeHandler(self._file_handler)
                self._file_handler.close()

    def _boot(self) -> None:
        if self.identity is None:
            self.identity = fetch_identity()
        self.log = agent_log.agent_logger(self.identity.instance_id)
        c = self.config
        self.log.info("event=mount efs_id=%r mount_point=%s", c.efs_id, c.mount_point)
        ensure_mounted(c.efs_id, c.region, c.mount_point, no_mount=c.no_mount,
                       timeout=c.mount_timeout, logger=self.log)
        self._file_handler = agent_log.add_file_log(
            self.log, self.efs / ms.EFS_LOGS_DIR / f"{self.identity.instance_id}.log")
        self.log.info("event=start role=%s cluster_id=%s stack=%s address=%s type=%s root=%s "
                      "pid=%d", c.role, c.cluster_id, c.stack_name, self.identity.address,
                      self.identity.instance_type, c.root, os.getpid())
        self.gpus = count_gpus(c.nvidia_smi)
        local = self._local_membership()
        self.applied_generation = local.generation if local else 0
        self.log.info("event=identity gpus=%d efs=%s applied_generation=%d",
                      self.gpus, self.efs, self.applied_generation)
        self._register()

    def _local_membership(self) -> ms.Membership | None:
        try:
            m = ms.Membership.load(self.root / ms.MEMBERSHIP_FILE)
        except (OSError, ms.MembershipError):
            return None
        return m if m.cluster_id == self.config.cluster_id else None

    # -- registration / heartbeat ---------------------------------------------------------
    def registration(self) -> dict:
        return {
            "instance_id": self.identity.instance_id, "address": self.identity.address,
            "role": self.config.role, "gpus": self.gpus,
            "instance_type": self.identity.instance_type, "agent_pid": os.getpid(),
            "started_at": self.started_at, "heartbeat": time.time(),
            "generation_applied": self.applied_generation,
            "efs_mount": self.config.mount_point, "cluster_id": self.config.cluster_id,
        }

    def _register(self) -> None:
        with self._registration_lock:
            shared.write_registration(self.efs, self.registration())

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(self.config.heartbeat_interval):
            if self.draining:  # leaving: a heartbeat now would only leave a ghost behind
                continue
            try:
                self._register()
            except OSError as exc:
                self.log.warning("event=heartbeat-failed error=%r", exc)

    # -- applying a membership (every node) ----------------------------------------------
    def apply(self, m: ms.Membership) -> bool:
        """Apply ``m`` locally; True if this node is a member at generation ``m.generation``."""
        if m.cluster_id != self.config.cluster_id:
            self.log.warning("event=skip-membership reason=other-cluster cluster_id=%r "
                             "generation=%d", m.cluster_id, m.generation)
            return False
        result = apply_membership(self.root, m, instance_id=self.identity.instance_id,
                                  address=self.identity.address)
        if result.status == "older":
            self.log.info("event=skip-membership reason=older generation=%d applied=%d",
                          m.generation, self.applied_generation)
            return False
        if result.status == "not-a-member":
            self.log.info("event=skip-membership reason=not-a-member generation=%d "
                          "instance_id=%s", m.generation, self.identity.instance_id)
            return False
        self.applied_generation = m.generation
        self.current = m
        self.log.info("event=applied generation=%d status=%s rank=%d nodes=%d master=%s "
                      "changed=%s", m.generation, result.status, result.node.rank,
                      len(m.nodes), m.master_addr, ",".join(result.changed) or "-")
        try:
            self._register()  # tell the master (and dl-health) at once, not at the next beat
        except OSError as exc:
            self.log.warning("event=heartbeat-failed error=%r", exc)
        return True

    # -- worker ----------------------------------------------------------------------------
    def _run_worker(self) -> int:
        if self.config.data_prep and not self.prepare():
            if not self.stop.is_set():
                self.log.error("event=not-joining reason=data-prep-failed (this node stays out "
                               "of the cluster; see %s)", shared.prepared_path(
                                   self.efs, self.identity.instance_id, "failed"))
                self.stop.wait()
            return 0
        path = self.efs / ms.EFS_MEMBERSHIP
        cluster_dir = self.efs / ms.EFS_CLUSTER_DIR
        drain_file = shared.drain_path(self.efs, self.identity.instance_id)
        last: shared.FileStamp | None = None
        ticks = 0
        self.log.info("event=watch path=%s interval=%.2fs", path, self.config.watch_interval)
        while not self.stop.is_set():
            current = shared.stamp(path)
            if current is None:
                shared.touch_directory(cluster_dir)  # let NFS notice a first publish sooner
            elif current != last:
                last = current
                self._apply_from_efs(path)
            ticks += 1
            if not self.draining and ticks % 4 == 0 and shared.stamp(drain_file) is not None:
                self.draining = True
                self.log.info("event=draining path=%s (heartbeat stopped; the job executor "
                              "stops this node's shares)", drain_file)
            self.stop.wait(self.config.watch_interval)
        return 0

    # -- data preparation (every node, before it joins) --------------------------------------
    def prepare(self) -> bool:
        """Run ``--data-prep`` once per instance; True when ``<EFS>/cluster/prepared/<id>.ok``.

        The outcome is a marker on EFS, so a restarted agent does not run it again and the
        master (and ``dl-scale --status``) can see it. Output goes to ``<id>.log`` beside it.
        """
        iid = self.identity.instance_id
        done = shared.prep_status(self.efs, iid)
        if done is not None:
            self.log.info("event=data-prep-skipped reason=already-%s", done)
            return done == "ok"
        directory = self.efs / shared.EFS_PREPARED_DIR
        directory.mkdir(parents=True, exist_ok=True)
        log_path = directory / f"{iid}.log"
        env = {**os.environ, "DL_INSTANCE_ID": iid, "DL_NODE_ADDRESS": self.identity.address,
               "DL_CLUSTER_ID": self.config.cluster_id, "DL_ROLE": self.config.role,
               "EFS_MOUNT": self.config.mount_point}
        started = time.time()
        self.log.info("event=data-prep-start command=%r timeout=%.0fs", self.config.data_prep,
                      self.config.data_prep_timeout)
        error = ""
        with open(log_path, "ab") as out:
            try:
                proc = subprocess.Popen(["/bin/sh", "-c", self.config.data_prep], stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, start_new_session=True)
            except OSError as exc:
                proc, error = None, f"cannot start: {exc}"
            give_up = time.monotonic() + self.config.data_prep_timeout
            while proc is not None and proc.poll() is None:
                if self.stop.wait(0.1):
                    _stop_group(proc)
                    self.log.info("event=data-prep-interrupted (will run again at restart)")
                    return False
                if time.monotonic() >= give_up:
                    _stop_group(proc)
                    error = f"timed out after {self.config.data_prep_timeout:.0f}s"
        exit_code = proc.returncode if proc is not None else None
        if not error and exit_code != 0:
            error = f"exit status {exit_code}"
        record = {"instance_id": iid, "address": self.identity.address,
                  "command": self.config.data_prep, "started_at": started,
                  "finished_at": time.time(), "seconds": round(time.time() - started, 3),
                  "exit_code": exit_code}
        if error:
            record["error"] = error
            record["output_tail"] = _tail(log_path)
        outcome = "failed" if error else "ok"
        ms.atomic_write(shared.prepared_path(self.efs, iid, outcome),
                        json.dumps(record, sort_keys=True) + "\n")
        self.log.log(logging.ERROR if error else logging.INFO,
                     "event=data-prep-%s seconds=%.1f exit_code=%s error=%r", outcome,
                     record["seconds"], exit_code, error)
        return not error

    def _apply_from_efs(self, path: Path) -> None:
        try:
            m = ms.Membership.load(path)
        except FileNotFoundError:
            return
        except (OSError, ms.MembershipError) as exc:
            self.log.warning("event=bad-membership path=%s error=%s", path, exc)
            return
        self.apply(m)  # idempotent: same generation writes nothing, older ones are skipped

    # -- master ----------------------------------------------------------------------------
    def _clients(self) -> None:
        import boto3  # only the master talks to AWS APIs

        session = boto3.session.Session(region_name=self.config.region)
        self._sqs = session.client("sqs")
        self._autoscaling = session.client("autoscaling")
        self._ec2 = session.client("ec2")

    def _load_state(self) -> MasterState:
        try:
            data = json.loads((self.root / STATE_FILE).read_text())
            return MasterState(float(data["setup_started"]), dict(data.get("setup", {})))
        except (OSError, ValueError, KeyError, TypeError):
            return MasterState(setup_started=time.time())

    def _save_state(self, state: MasterState) -> None:
        ms.atomic_write(self.root / STATE_FILE, json.dumps(asdict(state), sort_keys=True) + "\n",
                        mode=0o600)

    def _run_master(self) -> int:
        self._clients_thread.join()
        if self._sqs is None or self._ec2 is None:
            raise SetupFailed(f"could not create AWS clients for region {self.config.region!r}"
                              " (see the traceback above)")
        state = self._load_state()
        self._save_state(state)
        self._drains = shared.pending_drains(self.efs)
        if self._drains:
            self.log.info("event=drains-resumed instances=%s", ",".join(sorted(self._drains)))
        published = self._resume()
        if published is None and self.config.data_prep and not self.prepare():
            if self.stop.is_set():
                return 0
            failed = shared.prepared_path(self.efs, self.identity.instance_id, "failed")
            raise SetupFailed(f"data preparation failed on the master "
                              f"{self.identity.instance_id}: see {failed}")
        if published is not None:
            self.formed.set()
            self.log.info("event=resume generation=%d (cluster already formed)",
                          published.generation)
        deadline = state.setup_started + self.config.setup_timeout
        last_resync = time.monotonic()
        resync_wanted = published is not None
        if published is not None:
            self._protect(published)
        while not self.stop.is_set():
            wait = self.config.poll_wait
            if not self.formed.is_set():
                wait = max(0, min(wait, int(deadline - time.time()) + 1))
            else:
                wait = min(wait, JOIN_POLL_SECONDS)
                if (self._fallback_gpus and time.monotonic() < self._fast_poll_until) \
                        or self._pending_join or self._drains:
                    wait = min(wait, 1)  # something to look for on EFS: look often
            if self._drains:
                wait = min(wait, 1)
            for msg in self._receive(wait):
                resync_wanted |= self._handle(msg, state)
            self._check_drains()
            if not self.formed.is_set():
                if self._setup_complete(state):
                    self._form(state)
                    resync_wanted = False
                    last_resync = time.monotonic()
                elif time.time() >= deadline:
                    missing = [r for r in ("master", "worker") if r not in state.setup]
                    raise SetupFailed(
                        f"cluster {self.config.cluster_id}: no asg-setup success for "
                        f"{' and '.join(missing)} group(s) within {self.config.setup_timeout:.0f}s")
                continue
            if self._fallback_gpus and self._gpu_counts_changed():
                resync_wanted = True
            if self._joiners_ready() or self._new_registrations():
                resync_wanted = True
            if resync_wanted or time.monotonic() - last_resync >= self.config.resync_interval:
                self._resync("membership-change" if resync_wanted else "periodic-resync")
                resync_wanted = False
                last_resync = time.monotonic()
        return 0

    def _resume(self) -> ms.Membership | None:
        """After an agent restart: the cluster formed earlier iff EFS says so, with us master."""
        try:
            m = shared.read_current(self.efs)
        except (OSError, ms.MembershipError) as exc:
            self.log.warning("event=bad-membership path=%s error=%s",
                             self.efs / ms.EFS_MEMBERSHIP, exc)
            return None
        if m is None or m.cluster_id != self.config.cluster_id:
            return None
        if m.master.instance_id != self.identity.instance_id:
            return None
        self.apply(m)
        return m

    def _receive(self, wait: int) -> list[tuple[str, object]]:
        """Long-poll the master queue; returns (receipt handle, parsed message) pairs."""
        try:
            self.interruptible = True  # a stop signal may abandon this call (nothing is lost)
            try:
                resp = self._sqs.receive_message(
                    QueueUrl=self.config.master_queue_url, MaxNumberOfMessages=10,
                    WaitTimeSeconds=wait)
            finally:
                self.interruptible = False
        except Exception as exc:  # network blips must not kill the agent
            self.log.warning("event=sqs-receive-failed error=%r", exc)
            self.stop.wait(min(5.0, max(wait, 1)))
            return []
        return [(m["ReceiptHandle"], parse_message(m.get("Body", "")))
                for m in resp.get("Messages", [])]

    def _delete(self, receipt: str) -> None:
        try:
            self._sqs.delete_message(QueueUrl=self.config.master_queue_url,
                                     ReceiptHandle=receipt)
        except Exception as exc:
            self.log.warning("event=sqs-delete-failed error=%r", exc)

    def _handle(self, item: tuple[str, object], state: MasterState) -> bool:
        """Process one message; returns True when the groups should be re-read."""
        receipt, msg = item
        resync = False
        if isinstance(msg, BadMessage):
            self.log.warning("event=skip-message reason=%r body=%r", msg.reason, msg.body[:200])
        elif msg.cluster_id and msg.cluster_id != self.config.cluster_id:
            self.log.warning("event=skip-message reason=other-cluster cluster_id=%r",
                             msg.cluster_id)
        elif isinstance(msg, AsgSetup):
            self.log.info("event=asg-setup role=%s asg=%s status=%s desired=%d launched=%d "
                          "reason=%r", msg.role, msg.asg, msg.status, msg.desired, msg.launched,
                          msg.reason)
            if not self.formed.is_set():
                if msg.status == "failure":
                    self._delete(receipt)
                    cause = f" ({msg.cause})" if msg.cause else ""
                    raise SetupFailed(f"{msg.role} group {msg.asg}: {msg.reason}{cause}")
                state.setup[msg.role] = asdict(msg)
                self._save_state(state)
            else:
                resync = True
        elif isinstance(msg, DrainRequest):
            self.log.info("event=drain-request role=%s asg=%s instance_id=%s hook=%s",
                          msg.role, msg.asg, msg.instance_id, msg.lifecycle_hook)
            resync = self._start_drain(msg)
        elif isinstance(msg, MembershipChange):
            self.log.info("event=membership-change role=%s asg=%s change=%s instance_id=%s",
                          msg.role, msg.asg, msg.change, msg.instance_id)
            resync = self.formed.is_set()  # before formation, formation reads the groups
        self._delete(receipt)
        return resync

    @staticmethod
    def _setup_complete(state: MasterState) -> bool:
        return all(state.setup.get(r, {}).get("status") == "success" for r in ("master", "worker"))

    # -- building memberships ----------------------------------------------------------------
    def _self_entry(self) -> dict:
        return {"instance_id": self.identity.instance_id, "address": self.identity.address,
                "gpus": self.gpus, "instance_type": self.identity.instance_type}

    def _discover_workers(self, extra_ids: tuple[str, ...] = ()) -> list[disco.Instance]:
        """Live worker instances (plus extra master-group instances, which are not masters)."""
        found: dict[str, disco.Instance] = {}
        for role in ("master", "worker"):
            try:
                group = disco.group_state(self._autoscaling, self._ec2,
                                          self.config.cluster_id, role)
            except disco.DiscoveryError as exc:
                raise SetupFailed(str(exc)) from exc
            if group is None:
                self.log.error("event=group-missing role=%s cluster_id=%s tags=%s,%s",
                               role, self.config.cluster_id, disco.CLUSTER_TAG_KEY,
                               disco.ROLE_TAG_KEY)
                continue
            self._group_names[role] = group.name
            if role == "worker":
                self._group_members = {i.instance_id for i in group.instances}
            if group.missing_address:
                self.log.info("event=no-address-yet role=%s instances=%s", role,
                              ",".join(group.missing_address))
            for inst in group.instances:
                if role == "master" and inst.instance_id != self.identity.instance_id:
                    self.log.warning("event=extra-master instance_id=%s (ignored)",
                                     inst.instance_id)
                    continue
                if role == "worker":
                    found[inst.instance_id] = inst
        missing = [i for i in extra_ids if i not in found and i != self.identity.instance_id]
        if missing:
            for inst in disco.describe_addresses(self._ec2, missing).values():
                found[inst.instance_id] = inst
        return sorted(found.values(), key=lambda i: i.instance_id)

    def _entries(self, workers: list[disco.Instance], registrations: dict[str, dict],
                 base: set[str] | None = None) -> tuple[list[dict], set[str]]:
        """Worker entries with GPU counts from registrations; ids that used the fallback.
        ``base`` names the protected workers (None: every worker is base)."""
        entries, fallback = [], set()
        for inst in workers:
            reg = registrations.get(inst.instance_id)
            if reg is not None and isinstance(reg.get("gpus"), int):
                gpus = reg["gpus"]
            else:
                gpus = self.gpus
                fallback.add(inst.instance_id)
            entries.append({"instance_id": inst.instance_id, "address": inst.address,
                            "gpus": gpus, "instance_type": inst.instance_type,
                            "base": base is None or inst.instance_id in base})
        return entries, fallback

    def _read_registrations(self, ids: list[str]) -> dict[str, dict]:
        """Open each expected registration by path: on NFS, open() revalidates, listings lag."""
        out = {}
        for iid in ids:
            try:
                out[iid] = json.loads(shared.node_registration_path(self.efs, iid).read_text())
            except (OSError, ValueError):
                continue
        return out

    def _form(self, state: MasterState) -> None:
        expected = tuple(state.setup["worker"].get("instances", ()))
        for role in ("master", "worker"):
            if state.setup.get(role, {}).get("asg"):
                self._group_names.setdefault(role, state.setup[role]["asg"])
        give_up = time.monotonic() + self.config.registration_wait
        # With a data-preparation hook, registered nodes may take long to be prepared: wait
        # for their markers up to the setup deadline (not the registration wait).
        prep_give_up = time.monotonic() + max(
            0.0, state.setup_started + self.config.setup_timeout - time.time() - 5.0)
        workers = self._discover_with_retry(expected)
        described = time.monotonic()
        while True:
            ids = [w.instance_id for w in workers]
            registrations = self._read_registrations(ids)  # cheap: one open() per node
            unregistered = [i for i in ids if i not in registrations]
            absent = [i for i in expected if i not in ids]
            unprepared = [i for i in ids if i in registrations and self.config.data_prep
                          and shared.prep_status(self.efs, i) is None]
            waiting_registration = (unregistered or absent) and time.monotonic() < give_up
            waiting_prep = unprepared and time.monotonic() < prep_give_up
            if not (waiting_registration or waiting_prep) or self.stop.is_set():
                break
            self.stop.wait(0.1)
            if absent and time.monotonic() - described >= 2.0:  # AWS APIs: every 2 s at most
                workers = self._discover_with_retry(expected)
                described = time.monotonic()
        if absent:
            self.log.warning("event=workers-absent instances=%s (the Lambda listed them; "
                             "proceeding with the nodes present)", ",".join(absent))
        if unregistered:
            self.log.warning("event=workers-unregistered instances=%s waited=%.0fs (using the "
                             "master's GPU count %d for them)", ",".join(unregistered),
                             self.config.registration_wait, self.gpus)
        workers = [w for w in workers if w.instance_id not in self._drains]
        if self.config.data_prep:
            # A node joins only once prepared; late ones join after formation (and are
            # promoted to base while the base count is short).
            ready = [w for w in workers if w.instance_id in registrations
                     and shared.prep_status(self.efs, w.instance_id) == "ok"]
            left_out = sorted({w.instance_id for w in workers} - {w.instance_id for w in ready})
            if left_out:
                self.log.warning("event=workers-not-prepared instances=%s (they join when "
                                 "prepared)", ",".join(left_out))
                self._pending_join = set(left_out)
            workers = ready
        base = self._choose_base(workers)
        entries, fallback = self._entries(workers, registrations, base)
        m = self._publish(entries, reason="initial")
        self._set_fallback(fallback)
        self._protect(m)
        self.formed.set()
        data = json.dumps({"nodes": len(m.nodes), "generation": m.generation,
                           "master": m.master_addr})
        self._signal(wc.SUCCESS, f"cluster {self.config.cluster_id} formed: {len(m.nodes)} "
                     f"nodes, generation {m.generation}", data)

    def _discover_with_retry(self, expected: tuple[str, ...]) -> list[disco.Instance]:
        """Describe the groups, riding out API throttling and blips for up to a minute."""
        give_up = time.monotonic() + 60.0
        while True:
            try:
                return self._discover_workers(expected)
            except SetupFailed:
                raise
            except Exception as exc:
                if time.monotonic() >= give_up:
                    raise SetupFailed(f"cannot describe the groups of cluster "
                                      f"{self.config.cluster_id}: {exc}") from exc
                self.log.warning("event=describe-retry error=%r", exc)
                self.stop.wait(2.0)

    def _gpu_counts_changed(self) -> bool:
        """True when a node we guessed the GPU count for has registered a different one."""
        if self.current is None:
            return False
        registrations = self._read_registrations(sorted(self._fallback_gpus))
        changed = False
        for iid, reg in registrations.items():
            node = self.current.node_by_instance(iid)
            if node is not None and reg.get("gpus") != node.gpus:
                changed = True
            self._fallback_gpus = set(self._fallback_gpus) - {iid}
        return changed

    def _resync(self, reason: str) -> None:
        """Re-read the groups (and hand-started nodes) and publish if the membership changed.

        Members stay while their instance is live and not draining; a newcomer joins only
        once registered and, with a data-preparation hook, prepared (protocol.md §7)."""
        try:
            workers = self._discover_workers(self._registered_outsiders())
        except SetupFailed as exc:
            self.log.error("event=resync-failed error=%s", exc)
            return
        except Exception as exc:
            self.log.warning("event=resync-failed error=%r", exc)
            return
        registrations = self._read_registrations([w.instance_id for w in workers])
        members = {n.instance_id: n for n in (self.current.nodes if self.current else ())}
        eligible: list[disco.Instance] = []
        pending: set[str] = set()
        for w in workers:
            if w.instance_id in self._drains:
                continue
            if w.instance_id in members:
                eligible.append(w)
                continue
            blocker = self._join_blocker(w.instance_id, registrations)
            if blocker is None:
                eligible.append(w)
            elif blocker != "excluded":
                pending.add(w.instance_id)
        if pending != self._pending_join and pending:
            self.log.info("event=joiners-pending instances=%s", ",".join(sorted(pending)))
        self._pending_join = pending
        base = self._base_after(eligible, members)
        entries, fallback = self._entries(eligible, registrations, base)
        candidate = ms.build_membership(
            cluster_id=self.config.cluster_id, generation=1, master=self._self_entry(),
            workers=entries, efs_mount=self.config.mount_point)
        if self.current is not None and candidate.nodes == self.current.nodes:
            self.log.info("event=resync reason=%s unchanged generation=%d", reason,
                          self.current.generation)
            return
        m = self._publish(entries, reason=reason)
        self._set_fallback(fallback | (self._fallback_gpus & set(members)))
        promoted = {n.instance_id for n in m.nodes[1:] if n.base} - {
            i for i, n in members.items() if n.base}
        if promoted:
            self._protect(m, only=promoted)

    # -- elastic membership: joins, base workers, protection, drains (protocol.md §7) --------
    def _join_blocker(self, iid: str, registrations: dict[str, dict]) -> str | None:
        """Why a live worker that is not a member cannot join yet (None: it can)."""
        if shared.read_drain(self.efs, iid) is not None:
            return "excluded"  # drained once: it is on its way out
        if iid not in registrations:
            return "unregistered"
        if self.config.data_prep:
            status = shared.prep_status(self.efs, iid)
            if status is None:
                return "preparing"
            if status == "failed":
                if iid not in self._prep_failed_logged:
                    self._prep_failed_logged.add(iid)
                    self.log.warning("event=join-refused instance_id=%s reason=data-prep-failed",
                                     iid)
                return "excluded"
        return None

    def _joiners_ready(self) -> bool:
        """True when a pending joiner has registered and prepared (or failed: drop it)."""
        if not self._pending_join:
            return False
        ids = sorted(self._pending_join)
        registrations = self._read_registrations(ids)
        ready = False
        for iid in ids:
            blocker = self._join_blocker(iid, registrations)
            if blocker == "excluded":
                self._pending_join.discard(iid)
            elif blocker is None:
                ready = True
        return ready

    def _new_registrations(self) -> bool:
        """True when a node registered that we have not considered yet (e.g. started by
        hand from the worker launch template: no Auto Scaling message announces it)."""
        try:
            names = {e.name[:-5] for e in os.scandir(self.efs / ms.EFS_NODES_DIR)
                     if e.name.endswith(".json") and not e.name.startswith(".")}
        except FileNotFoundError:
            return False
        known = {n.instance_id for n in self.current.nodes} if self.current else set()
        unknown = names - known - self._seen_registrations - self._pending_join
        self._seen_registrations |= unknown
        return bool(unknown)

    def _registered_outsiders(self) -> tuple[str, ...]:
        """Registered workers of this cluster that are in no group (started by hand)."""
        out = []
        for iid, reg in shared.read_registrations(self.efs).items():
            if reg.get("role") == "worker" and reg.get("cluster_id", self.config.cluster_id) \
                    == self.config.cluster_id and iid not in self._group_members:
                out.append(iid)
        return tuple(sorted(out))

    def _choose_base(self, workers: list[disco.Instance]) -> set[str]:
        """The protected workers at formation: the first ``--base-workers`` in membership
        order, on-demand before Spot (a Spot instance can be reclaimed whatever we set)."""
        target = len(workers) if self.config.base_workers < 0 else self.config.base_workers
        self._base_target = target
        ordered = sorted(workers, key=lambda w: (w.spot, ms._address_key(w.address),
                                                 w.instance_id))
        return {w.instance_id for w in ordered[:target]}

    def _base_after(self, eligible: list[disco.Instance], members: dict[str, ms.Node]) -> set[str]:
        """Members keep their flag; while fewer base workers remain than the target (a base
        worker was replaced), on-demand group members joining now are promoted."""
        base = {w.instance_id for w in eligible if members.get(w.instance_id)
                and members[w.instance_id].base}
        target = self._base_target
        if target is None:
            target = (self.config.base_workers if self.config.base_workers >= 0
                      else sum(1 for n in members.values() if n.role == "worker" and n.base))
            self._base_target = target
        candidates = sorted((w for w in eligible if w.instance_id not in members
                             and not w.spot and w.instance_id in self._group_members),
                            key=lambda w: (ms._address_key(w.address), w.instance_id))
        for w in candidates:
            if len(base) >= target:
                break
            base.add(w.instance_id)
        return base

    def _protect(self, m: ms.Membership, only: set[str] | None = None) -> None:
        """Scale-in protection for the master and the base workers (idempotent)."""
        wanted = {"master": [m.master.instance_id],
                  "worker": [n.instance_id for n in m.nodes[1:] if n.base]}
        for role, ids in wanted.items():
            if only is not None:
                ids = [i for i in ids if i in only]
            group = self._group_names.get(role)
            if not ids or not group:
                continue
            try:
                for start in range(0, len(ids), 50):  # the API takes 50 ids per call
                    self._autoscaling.set_instance_protection(
                        InstanceIds=ids[start:start + 50], AutoScalingGroupName=group,
                        ProtectedFromScaleIn=True)
                self.log.info("event=protected role=%s asg=%s instances=%s", role, group,
                              ",".join(ids))
            except Exception as exc:  # not fatal: dl-scale still refuses to remove them
                self.log.warning("event=protect-failed role=%s asg=%s error=%r", role, group, exc)

    def _start_drain(self, msg: DrainRequest) -> bool:
        """Record the drain and take the node out; True when the groups must be re-read.
        The same lifecycle action twice (a duplicate message) changes nothing."""
        iid = msg.instance_id
        existing = shared.read_drain(self.efs, iid)
        if existing and existing.get("lifecycle_action_token") == msg.lifecycle_action_token:
            if not existing.get("completed_at"):
                self._drains.setdefault(iid, existing)
            self.log.info("event=drain-duplicate instance_id=%s", iid)
            return False
        member = self.current.node_by_instance(iid) if self.current else None
        address = member.address if member else ""
        if not address:
            reg = self._read_registrations([iid]).get(iid, {})
            address = str(reg.get("address", ""))
        now = time.time()
        record = {"instance_id": iid, "address": address, "requested_at": now,
                  "deadline": now + self.config.drain_timeout, "asg": msg.asg,
                  "role": msg.role, "lifecycle_hook": msg.lifecycle_hook,
                  "lifecycle_action_token": msg.lifecycle_action_token,
                  "member": member is not None, "base": bool(member and member.base)}
        shared.write_drain(self.efs, record)
        self._drains[iid] = record
        self._pending_join.discard(iid)
        self.log.info("event=drain-start instance_id=%s address=%s member=%s deadline=%.0fs",
                      iid, address or "-", member is not None, self.config.drain_timeout)
        if iid == self.identity.instance_id:
            self.log.error("event=drain-self (the master cannot drain itself; completing)")
            self._complete_drain(iid, "master")
            return False
        if member is None or not self.formed.is_set():
            self._complete_drain(iid, "not-a-member")
            return self.formed.is_set()
        if member.base:
            self.log.warning("event=base-worker-leaving instance_id=%s (protection does not "
                             "stop Spot reclaims, health replacements or manual termination)",
                             iid)
        return True

    def _check_drains(self) -> None:
        now = time.time()
        for iid, record in list(self._drains.items()):
            if record.get("retry_at", 0) > now:
                continue
            if shared.stamp(shared.drain_done_path(self.efs, iid)) is not None:
                self._complete_drain(iid, "done")
            elif now >= float(record.get("deadline", 0)):
                self._complete_drain(iid, "deadline")

    def _complete_drain(self, iid: str, reason: str) -> None:
        """CompleteLifecycleAction CONTINUE, then mark the drain record completed."""
        record = self._drains.get(iid) or shared.read_drain(self.efs, iid) or {}
        outcome = "completed"
        try:
            self._autoscaling.complete_lifecycle_action(
                LifecycleHookName=record["lifecycle_hook"],
                AutoScalingGroupName=record["asg"],
                LifecycleActionToken=record["lifecycle_action_token"],
                LifecycleActionResult="CONTINUE", InstanceId=iid)
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if type(exc).__name__ == "ParamValidationError":  # a retry cannot fix the values
                outcome = f"invalid-request (the hook's default CONTINUE applies): {exc}"[:300]
            elif code == "ValidationError":
                # No such action any more (already completed, or the hook timed out and Auto
                # Scaling continued by itself): nothing left to do.
                outcome = f"no-active-action: {exc}"[:300]
            else:
                attempts = int(record.get("attempts", 0)) + 1
                record["attempts"] = attempts
                if attempts < COMPLETE_ATTEMPTS:
                    record["retry_at"] = time.time() + 2.0 * attempts
                    self.log.warning("event=drain-complete-retry instance_id=%s attempt=%d "
                                     "error=%r", iid, attempts, exc)
                    return
                outcome = f"gave-up (the hook's default CONTINUE applies): {exc!r}"[:300]
        record.pop("retry_at", None)
        finished = time.time()
        record.update(completed_at=finished, reason=reason, result="CONTINUE", outcome=outcome,
                      seconds=round(finished - float(record.get("requested_at", finished)), 3))
        shared.write_drain(self.efs, record)
        self._drains.pop(iid, None)
        with contextlib.suppress(FileNotFoundError):
            shared.node_registration_path(self.efs, iid).unlink()
        self.log.info("event=drain-complete instance_id=%s reason=%s seconds=%.1f outcome=%r",
                      iid, reason, record["seconds"], outcome)

    def _set_fallback(self, fallback: set[str]) -> None:
        """Remember guessed GPU counts; poll fast for their registrations for 10 minutes
        (after that a node that never registered is not worth a receive per second)."""
        self._fallback_gpus = set(fallback)
        if fallback:
            self._fast_poll_until = time.monotonic() + FAST_POLL_WINDOW

    def _publish(self, entries: list[dict], *, reason: str) -> ms.Membership:
        previous = None
        try:
            previous = shared.read_current(self.efs)
        except (OSError, ms.MembershipError) as exc:
            self.log.warning("event=bad-membership error=%s (overwriting)", exc)
        if previous is not None and previous.cluster_id != self.config.cluster_id:
            previous = None
        generation = shared.latest_generation(self.efs) + 1
        m = ms.build_membership(
            cluster_id=self.config.cluster_id, generation=generation,
            master=self._self_entry(), workers=entries, efs_mount=self.config.mount_point,
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), reason=reason)
        shared.publish(self.efs, m, previous)
        self._forget_departed(previous, m)
        self.log.info("event=publish generation=%d reason=%s nodes=%d addresses=%s", generation,
                      reason, len(m.nodes), ",".join(n.address for n in m.nodes))
        self.apply(m)
        return m

    def _forget_departed(self, previous: ms.Membership | None, new: ms.Membership) -> None:
        """Drop registrations of nodes that left, so dl-health does not report ghosts."""
        if previous is None:
            return
        for node in previous.nodes:
            if new.node_by_instance(node.instance_id) is None:
                with contextlib.suppress(FileNotFoundError):
                    shared.node_registration_path(self.efs, node.instance_id).unlink()

    def _signal(self, status: str, reason: str, data: str = "") -> None:
        unique_id = self.identity.instance_id if self.identity else "unknown"
        wc.signal(self.config.wait_handle, status, reason, unique_id, data, logger=self.log)


def _stop_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the command's process group, SIGKILL what is left after ``grace``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace")


def main(argv: list[str] | None = None) -> int:
    agent_log.configure_stderr()
    try:
        config = config_from_args(argv)
    except ValueError as exc:
        print(f"dl-agent: {exc}", file=sys.stderr)
        return 64
    agent = NodeAgent(config)

    def _stop(signum, _frame):
        agent.log.info("event=stop signal=%s", signum)
        agent.stop.set()
        if agent.interruptible:  # don't sit out a 20 s long poll (systemctl stop, tests)
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())

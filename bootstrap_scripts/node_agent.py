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
from bootstrap_scripts.messages import AsgSetup, BadMessage, MembershipChange, parse_message
from bootstrap_scripts.node_files import apply_membership

#: Exit status for a definite failure already reported (systemd must not restart it).
EXIT_FAILED = 2
#: Local (per-instance) agent state: survives an agent restart, never shared across nodes.
STATE_FILE = "var/lib/dl-agent/state.json"
#: Seconds the master polls every second while a node's GPU count is still a guess.
FAST_POLL_WINDOW = 600.0


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
        path = self.efs / ms.EFS_MEMBERSHIP
        cluster_dir = self.efs / ms.EFS_CLUSTER_DIR
        last: shared.FileStamp | None = None
        self.log.info("event=watch path=%s interval=%.2fs", path, self.config.watch_interval)
        while not self.stop.is_set():
            current = shared.stamp(path)
            if current is None:
                shared.touch_directory(cluster_dir)  # let NFS notice a first publish sooner
            elif current != last:
                last = current
                self._apply_from_efs(path)
            self.stop.wait(self.config.watch_interval)
        return 0

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
        published = self._resume()
        if published is not None:
            self.formed.set()
            self.log.info("event=resume generation=%d (cluster already formed)",
                          published.generation)
        deadline = state.setup_started + self.config.setup_timeout
        last_resync = time.monotonic()
        resync_wanted = published is not None
        while not self.stop.is_set():
            wait = self.config.poll_wait
            if not self.formed.is_set():
                wait = max(0, min(wait, int(deadline - time.time()) + 1))
            elif self._fallback_gpus and time.monotonic() < self._fast_poll_until:
                wait = min(wait, 1)  # a guessed GPU count: look for its registration often
            for msg in self._receive(wait):
                resync_wanted |= self._handle(msg, state)
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

    def _entries(self, workers: list[disco.Instance],
                 registrations: dict[str, dict]) -> tuple[list[dict], set[str]]:
        """Worker entries with GPU counts from registrations; ids that used the fallback."""
        entries, fallback = [], set()
        for inst in workers:
            reg = registrations.get(inst.instance_id)
            if reg is not None and isinstance(reg.get("gpus"), int):
                gpus = reg["gpus"]
            else:
                gpus = self.gpus
                fallback.add(inst.instance_id)
            entries.append({"instance_id": inst.instance_id, "address": inst.address,
                            "gpus": gpus, "instance_type": inst.instance_type})
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
        give_up = time.monotonic() + self.config.registration_wait
        workers = self._discover_with_retry(expected)
        described = time.monotonic()
        while True:
            ids = [w.instance_id for w in workers]
            registrations = self._read_registrations(ids)  # cheap: one open() per node
            unregistered = [i for i in ids if i not in registrations]
            absent = [i for i in expected if i not in ids]
            if (not unregistered and not absent) or time.monotonic() >= give_up \
                    or self.stop.is_set():
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
        entries, fallback = self._entries(workers, registrations)
        m = self._publish(entries, reason="initial")
        self._set_fallback(fallback)
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
        try:
            workers = self._discover_workers()
        except SetupFailed as exc:
            self.log.error("event=resync-failed error=%s", exc)
            return
        except Exception as exc:
            self.log.warning("event=resync-failed error=%r", exc)
            return
        registrations = self._read_registrations([w.instance_id for w in workers])
        entries, fallback = self._entries(workers, registrations)
        candidate = ms.build_membership(
            cluster_id=self.config.cluster_id, generation=1, master=self._self_entry(),
            workers=entries, efs_mount=self.config.mount_point)
        if self.current is not None and candidate.nodes == self.current.nodes:
            self.log.info("event=resync reason=%s unchanged generation=%d", reason,
                          self.current.generation)
            return
        self._publish(entries, reason=reason)
        self._set_fallback(fallback)

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

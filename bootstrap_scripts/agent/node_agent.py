"""The node agent: runs on every cluster node (systemd ``dl-agent.service``, ``dl-agent``).

At boot it learns who it is (IMDSv2), mounts EFS, counts its GPUs and registers on EFS
(``cluster/nodes/<id>.json``, rewritten as its heartbeat). Then:

- the **master** (:mod:`.master`) waits for the capacity adjuster's ``asg-setup`` messages,
  forms the cluster (generation 1 on EFS), signals the wait condition, and afterwards
  publishes a new generation whenever the groups, the registrations or a drain change it;
- a **worker** (:mod:`.worker`) watches ``<EFS>/cluster/membership.json`` and applies every
  newer generation that lists it.

Every node applies a membership the same way (:meth:`NodeAgent.apply`, rendering through
:mod:`bootstrap_scripts.protocol.node_files`), so the files are byte-identical across nodes.

The worker SQS queue of the original template is gone: SQS delivers each message to ONE
consumer, so it cannot broadcast (the original faked it with visibility timeout 0 and never
deleting, and every worker re-read stale messages forever). EFS already is the shared,
consistent medium every node mounts, so the membership lives there.

Everything configurable comes from the command line (:mod:`.settings`), so the local
emulator runs this same entry point with ``--root <node dir> --no-mount``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from bootstrap_scripts.agent import log as agent_log
from bootstrap_scripts.agent import node_keys_queue, warm_pool, warm_ready
from bootstrap_scripts.agent import wait_condition as wc
from bootstrap_scripts.agent.efs_mount import MountError, ensure_mounted
from bootstrap_scripts.agent.gpus import count_gpus
from bootstrap_scripts.agent.identity import (
    IdentityError,
    NodeIdentity,
    fetch_identity,
    read_metadata,
)
from bootstrap_scripts.agent.node_files import apply_membership
from bootstrap_scripts.agent.node_keys_queue import NodeKey
from bootstrap_scripts.agent.settings import (
    EXIT_ALREADY_RUNNING,
    EXIT_FAILED,
    EXIT_USAGE,
    LOCK_NAME,
    AgentConfig,
    build_parser,
    config_from_args,
)
from bootstrap_scripts.agent.worker import run_worker
from bootstrap_scripts.node.single_instance import AlreadyRunning, UnsafeLockFile, acquire
from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.membership import Membership, MembershipError
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import Registration

if TYPE_CHECKING:
    from bootstrap_scripts.agent.aws import MasterAws

__all__ = ["EXIT_FAILED", "AgentConfig", "NodeAgent", "build_parser", "config_from_args",
           "main"]


class NodeAgent:
    """One node's agent. ``run()`` blocks until ``stop_event`` is set or setup fails."""

    def __init__(self, config: AgentConfig, *, identity: NodeIdentity | None = None,
                 stop_event: threading.Event | None = None) -> None:
        self.config = config
        self.identity = identity
        self.stop = stop_event or threading.Event()
        self.log = agent_log.agent_logger("starting")
        self.cluster = ClusterPaths(config.mount_point)
        self.paths = NodePaths(config.root)
        self.gpus = 0
        self.started_at = time.time()
        self.applied_generation = 0
        self.current: Membership | None = None
        self.formed = threading.Event()
        #: worker: this node is being drained (stop heartbeating: it is leaving).
        self.draining = False
        #: this node's signing key (made or read at boot: ``node_keys_queue``).
        self.node_key: NodeKey | None = None
        self.aws: MasterAws | None = None
        if config.role == "master":
            # The master's modules (boto3, the state machine) load on the master only: a
            # worker's start-up is on the critical path of every join.
            from bootstrap_scripts.agent.aws import MasterAws

            self.aws = MasterAws(region=config.region, queue_url=config.master_queue_url,
                                 cluster_id=config.cluster_id, stop=self.stop)
        self._file_handler: logging.Handler | None = None
        self._registration_lock = threading.Lock()

    @property
    def interruptible(self) -> bool:
        """True while blocked in an SQS long poll (a stop signal may abandon it)."""
        return self.aws is not None and self.aws.interruptible

    # -- lifecycle -----------------------------------------------------------------------
    def run(self) -> int:
        """Hold this node's agent lock for the whole run (one agent per node), then boot
        and play the role; the exit status."""
        try:
            lock = acquire(self.paths.lock(LOCK_NAME))
        except (AlreadyRunning, UnsafeLockFile) as exc:
            # Nothing else happens: no registration, no queue, no signal (the running
            # agent's cluster must not hear from this one).
            self.log.error("event=already-running error=%s exit=%d (systemd does not "
                           "restart this status)", exc, EXIT_ALREADY_RUNNING)
            return EXIT_ALREADY_RUNNING
        try:
            return self._run_locked()
        finally:
            lock.release()

    def _run_locked(self) -> int:
        if self.aws is not None:
            self.aws.start()  # overlaps client creation with identity and mount
        try:
            if not self._boot():
                return 0  # held in the warm pool until stopped, or leaving: never joined
        except (IdentityError, MountError) as exc:
            self.log.error("event=boot-failed error=%s", exc)
            if self.config.role == "master":
                self.signal(wc.FAILURE, f"node agent could not start: {exc}")
            return EXIT_FAILED
        heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                     name=f"heartbeat-{self.identity.instance_id}")
        heartbeat.start()
        try:
            if self.aws is not None:
                from bootstrap_scripts.agent.master import Master

                node_keys_queue.serve(self, lambda: self.aws.sqs)  # before any record is read
                return Master(self, self.aws).run()
            return run_worker(self)
        finally:
            self.stop.set()
            heartbeat.join(timeout=5)
            if self._file_handler is not None:
                self.log.removeHandler(self._file_handler)
                self._file_handler.close()

    def _boot(self) -> bool:
        """Identity, EFS, GPUs, then (past a warm pool's hold) the registration; False if
        this launch must not join (``bootstrap_scripts.agent.warm_pool``)."""
        if self.identity is None:
            self.identity = fetch_identity()
        self.log = agent_log.agent_logger(self.identity.instance_id)
        c = self.config
        self.log.info("event=mount efs_id=%r mount_point=%s", c.efs_id, c.mount_point)
        ensure_mounted(c.efs_id, c.region, c.mount_point, no_mount=c.no_mount,
                       timeout=c.mount_timeout, logger=self.log)
        self._file_handler = agent_log.add_file_log(
            self.log, self.cluster.agent_log(self.identity.instance_id))
        self.log.info("event=start role=%s cluster_id=%s stack=%s address=%s type=%s root=%s "
                      "pid=%d", c.role, c.cluster_id, c.stack_name, self.identity.address,
                      self.identity.instance_type, c.root, os.getpid())
        self.gpus = count_gpus(c.nvidia_smi)
        local = self._local_membership()
        self.applied_generation = local.generation if local else 0
        self.log.info("event=identity gpus=%d efs=%s applied_generation=%d",
                      self.gpus, self.cluster.efs, self.applied_generation)
        if c.launch_hook and c.role == "worker" and not self._await_service():
            return False
        self.node_key = NodeKey(self.paths, instance_id=self.identity.instance_id, log=self.log,
                                queue_url=c.node_keys_queue_url if c.role == "worker" else "",
                                region=c.region)
        self._announce_key()
        self._register()
        return True

    def _await_service(self) -> bool:
        """A group with a warm pool: hold while this instance is on its way into the pool
        (its bootstrap above is what the pool keeps), join once it goes InService. The
        worker says it is ready; the master completes its launch action
        (``bootstrap_scripts.agent.warm_ready``)."""
        c = self.config
        signal = warm_ready.ReadySignal(queue_url=c.warm_ready_queue_url, region=c.region,
                                        instance_id=self.identity.instance_id,
                                        hook_name=c.launch_hook)
        return warm_pool.await_service(
            lambda: read_metadata(warm_pool.TARGET_LIFECYCLE_STATE_PATH), signal.send,
            stop=self.stop, log=self.log, poll=c.warm_poll_interval)

    def _local_membership(self) -> Membership | None:
        try:
            m = Membership.load(self.paths.membership)
        except (OSError, MembershipError):
            return None
        return m if m.cluster_id == self.config.cluster_id else None

    # -- registration / heartbeat ---------------------------------------------------------
    def registration(self) -> Registration:
        return Registration(
            instance_id=self.identity.instance_id, address=self.identity.address,
            role=self.config.role, gpus=self.gpus,
            instance_type=self.identity.instance_type, agent_pid=os.getpid(),
            started_at=self.started_at, heartbeat=time.time(),
            generation_applied=self.applied_generation,
            efs_mount=self.config.mount_point, cluster_id=self.config.cluster_id)

    def _register(self) -> None:
        with self._registration_lock:
            state.write_registration(self.cluster.efs, self.registration(),
                                     self.node_key.sign if self.node_key else None)

    def _announce_key(self) -> None:
        """A worker: its public key to the master (again for a new master, and now and then:
        ``node_keys_queue``)."""
        current = self.current or self._local_membership()
        if self.node_key is not None:
            self.node_key.announce(current.master.instance_id if current else "")

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(self.config.heartbeat_interval):
            if self.draining:  # leaving: a heartbeat now would only leave a ghost behind
                continue
            self._announce_key()
            try:
                self._register()
            except OSError as exc:
                self.log.warning("event=heartbeat-failed error=%r", exc)

    # -- applying a membership (every node) ----------------------------------------------
    def apply(self, m: Membership) -> bool:
        """Apply ``m`` locally; True if this node is a member at generation ``m.generation``."""
        if m.cluster_id != self.config.cluster_id:
            self.log.warning("event=skip-membership reason=other-cluster cluster_id=%r "
                             "generation=%d", m.cluster_id, m.generation)
            return False
        result = apply_membership(self.paths.root, m, instance_id=self.identity.instance_id,
                                  address=self.identity.address,
                                  applied=self.applied_generation)
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

    def signal(self, status: str, reason: str, data: str = "") -> None:
        """Signal the wait condition (the master only has a handle)."""
        unique_id = self.identity.instance_id if self.identity else "unknown"
        wc.signal(self.config.wait_handle, status, reason, unique_id, data, logger=self.log)


def main(argv: list[str] | None = None) -> int:
    agent_log.configure_stderr()
    try:
        config = config_from_args(argv)
    except ValueError as exc:
        print(f"dl-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
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

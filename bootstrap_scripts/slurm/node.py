"""What the node agent does for Slurm (``--scheduler slurm``).

- :func:`install_munge_key` at boot, before the node registers: the cluster's munge key read
  from Secrets Manager with the node's role (the one AWS call of this package) and written
  for munged (:mod:`.munge_key`);
- :func:`write_config` each time the node applies a membership: slurm.conf (the master's
  address is the membership's rank 0), gres.conf (this node's GPUs) and cgroup.conf, each
  rewritten only when its bytes change; the Slurm units wait for them
  (:mod:`.daemons`);
- :class:`Reconciler` on the master, after each membership it applies: Slurm's node list
  brought to the membership (:mod:`.reconcile`), with the names of earlier members kept so a
  lost node's reason names its instance; and :class:`HealthMarks`: a worker the health
  gate's prolog drained (:mod:`.prolog`) marked Unhealthy, so Auto Scaling replaces it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import bootstrap_scripts
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.protocol.store import atomic_write, read_text
from bootstrap_scripts.slurm import config, munge_key, names, reconcile

log = logging.getLogger(__name__)


class SlurmSetupError(RuntimeError):
    """The node cannot take part in Slurm (no munge key); the message says why."""


def read_munge_secret(arn: str, region: str) -> bytes:
    """The munge key's bytes from Secrets Manager (GetSecretValue with the node's role)."""
    import boto3

    answer = boto3.session.Session(region_name=region).client(
        "secretsmanager").get_secret_value(SecretId=arn)
    return munge_key.key_bytes(answer.get("SecretString"), answer.get("SecretBinary"))


def install_munge_key(paths: SlurmPaths, arn: str, region: str) -> Path:
    """Read the key and write it for munged; the path written. SlurmSetupError when it
    cannot be read or written (the node cannot join Slurm without it)."""
    try:
        return munge_key.install_key(paths, read_munge_secret(arn, region))
    except munge_key.MungeKeyError as exc:
        raise SlurmSetupError(str(exc)) from None
    except Exception as exc:  # botocore's errors: no access, no such secret, no endpoint
        raise SlurmSetupError(f"the munge key {arn} could not be read: {exc}") from None


def package_dir() -> str:
    """The directory this package is installed in (root's: the agent runs from it)."""
    return str(Path(bootstrap_scripts.__file__).resolve().parent.parent)


def write_config(paths: SlurmPaths, cluster_id: str, membership: Membership,
                 gpus: int, *, python: str = "") -> list[Path]:
    """slurm.conf, gres.conf, cgroup.conf, the TaskProlog and the Prolog of this node for
    ``membership``; returns the files whose bytes changed. The Prolog runs ``python`` (the
    agent's own interpreter by default) on this package's own directory."""
    c = config.SlurmConfig(cluster_id=cluster_id, controller_address=membership.master.address,
                           root=str(paths.root), efs=str(paths.efs))
    files = {paths.slurm_conf: config.render_slurm_conf(c),
             paths.gres_conf: config.render_gres_conf(gpus, str(paths.root)),
             paths.cgroup_conf: config.render_cgroup_conf()}
    scripts = {paths.task_prolog: config.render_task_prolog(str(NodePaths(paths.root).env)),
               paths.prolog: config.render_prolog(
                   python=python or sys.executable, package_dir=package_dir(),
                   root=str(paths.root), efs=str(paths.efs))}
    changed = []
    for path, text, mode in [*((p, t, 0o644) for p, t in files.items()),
                             *((p, t, 0o755) for p, t in scripts.items())]:
        if read_text(path) != text:
            atomic_write(path, text, mode=mode)
            changed.append(path)
    return changed


def slurm_env(paths: SlurmPaths) -> dict[str, str]:
    """The environment ``scontrol`` runs in: this node's slurm.conf (``/etc/slurm/slurm.conf``
    on EC2, Slurm's own default)."""
    return {**os.environ, "SLURM_CONF": str(paths.slurm_conf)}


def draining_instances(cluster: ClusterPaths) -> set[str]:
    """Instances with a drain request on EFS (``cluster/drain/<id>.json``)."""
    try:
        return {p.stem for p in cluster.drain_dir.iterdir() if p.suffix == ".json"}
    except OSError:
        return set()


class Reconciler:
    """The master's side: Slurm's nodes brought to each membership it applies."""

    def __init__(self, paths: SlurmPaths, cluster: ClusterPaths, *,
                 scontrol: str = "scontrol", squeue: str = "squeue") -> None:
        self.paths = paths
        self.cluster = cluster
        self.scontrol, self.squeue = scontrol, squeue
        #: Slurm node name -> instance id, of every member seen (a lost node's reason).
        self.known: dict[str, str] = {}
        #: Slurm's node list as the last pass read it (before its actions).
        self.listed: list[reconcile.SlurmNode] = []

    def remember(self, nodes: Iterable) -> None:
        for n in nodes:
            self.known[names.node_name(n.address)] = n.instance_id

    def run(self, membership: Membership) -> list[reconcile.Action] | None:
        """One pass; the actions done, or None when slurmctld did not answer."""
        self.remember(membership.nodes)
        env = slurm_env(self.paths)
        listed = reconcile.list_nodes(self.scontrol, env)
        if listed is None:
            return None
        self.listed = listed
        actions = reconcile.plan(membership, listed, known=self.known,
                                 draining=draining_instances(self.cluster))
        deletes = [a for a in actions if a.kind == reconcile.DELETE]
        done = reconcile.apply([a for a in actions if a.kind != reconcile.DELETE],
                               self.scontrol, env)
        if deletes:  # after the DOWNs: the jobs they ended are COMPLETING now
            completing = reconcile.completing_jobs(self.squeue, env)
            if completing == []:
                done += reconcile.apply(deletes, self.scontrol, env)
            else:
                log.info("event=slurm-delete-deferred nodes=%s completing=%s",
                         ",".join(a.node for a in deletes), ",".join(completing or ["?"]))
        return done


class HealthMarks:
    """The master's side of the health gate in Slurm: each worker Slurm lists as drained by
    the prolog (``reconcile.health_drained``: a ``dl-health:`` reason set by root, a member,
    never the master) marked Unhealthy once through the job controller's own path
    (``node_evidence.gate_verdicts`` decides, ``instance_health.InstanceHealth`` calls
    ``SetInstanceHealth`` within its circuit breaker). The node's own prolog is the
    evidence: its checks ran on that node and it drained that node."""

    def __init__(self, region: str, *, health=None) -> None:
        self.region = region
        self._health = health
        #: (instance id, reason) already acted on: one mark per drain, not per heartbeat
        self.done: set[tuple[str, str]] = set()

    @property
    def health(self):
        if self._health is None:  # boto3 only once a node actually failed
            from bootstrap_scripts.jobs.controller.instance_health import InstanceHealth

            self._health = InstanceHealth(self.region)
        return self._health

    def run(self, membership: Membership, listed: Iterable[reconcile.SlurmNode]
            ) -> list[tuple[str, str, str]]:
        """Mark what the listing shows; (instance id, why, "" or why not marked) of each
        node acted on in this pass."""
        drained = [(n, why) for n, why in reconcile.health_drained(membership, listed)
                   if (n.instance_id, why) not in self.done]
        # a node that left the drain (resumed, replaced) may be marked again if it drains
        still = {(n.instance_id, why) for n, why in reconcile.health_drained(membership, listed)}
        self.done &= still
        if not drained:
            return []
        from bootstrap_scripts.jobs.controller import node_evidence

        out = []
        for v in node_evidence.gate_verdicts(
                [(n.address, n.instance_id, why) for n, why in drained],
                master_instance=membership.master.instance_id,
                master_address=membership.master.address):
            err = self.health.mark_unhealthy(v.instance_id) if v.mark else v.note
            self.done.add((v.instance_id, v.why))
            out.append((v.instance_id, v.why, err))
        return out


class NodeSlurm:
    """The node agent's Slurm duties (``--scheduler slurm``), one object per agent.

    ``boot``: the munge key; ``applied``: this node's files for a membership it applied
    (and, on the master, a reconcile pass at once: a lost node is DOWN before the scheduler
    would notice); ``tick``: the master's reconcile again on every heartbeat, for what a
    pass could not do yet (slurmctld still starting, a node with a step still completing,
    a drain that needs no new generation)."""

    def __init__(self, *, root: str, efs: str, cluster_id: str, role: str,
                 munge_key_secret: str, region: str, logger: logging.Logger | None = None
                 ) -> None:
        self.paths = SlurmPaths(root, efs)
        self.cluster_id = cluster_id
        self.role = role
        self.secret = munge_key_secret
        self.region = region
        self.log = logger or log
        self.reconciler = Reconciler(self.paths, ClusterPaths(efs)) if role == "master" \
            else None
        self.health = HealthMarks(region) if role == "master" else None
        self._lock = threading.Lock()

    def boot(self) -> None:
        path = install_munge_key(self.paths, self.secret, self.region)
        self.log.info("event=munge-key path=%s", path)

    def applied(self, membership: Membership, gpus: int) -> None:
        changed = write_config(self.paths, self.cluster_id, membership, gpus)
        if changed:
            self.log.info("event=slurm-config generation=%d changed=%s", membership.generation,
                          ",".join(p.name for p in changed))
        self.tick(membership)

    def tick(self, membership: Membership | None) -> None:
        if self.reconciler is None or membership is None:
            return
        with self._lock:
            done = self.reconciler.run(membership)
            marked = self.health.run(membership, self.reconciler.listed) \
                if self.health is not None and done is not None else []
        for action in done or ():
            self.log.info("event=slurm-%s node=%s generation=%d reason=%r", action.kind,
                          action.node, membership.generation, action.reason)
        for instance, why, err in marked:
            self.log.warning("event=slurm-health-drained instance=%s reason=%r %s", instance,
                             why, f"not-marked={err!r}" if err else "marked=Unhealthy")

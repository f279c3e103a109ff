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
  lost node's reason names its instance.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.protocol.store import atomic_write, read_text
from bootstrap_scripts.slurm import config, munge_key, names, reconcile

log = logging.getLogger(__name__)


def read_munge_secret(arn: str, region: str) -> bytes:
    """The munge key's bytes from Secrets Manager (GetSecretValue with the node's role)."""
    import boto3

    answer = boto3.session.Session(region_name=region).client(
        "secretsmanager").get_secret_value(SecretId=arn)
    return munge_key.key_bytes(answer.get("SecretString"), answer.get("SecretBinary"))


def install_munge_key(paths: SlurmPaths, arn: str, region: str) -> Path:
    """Read the key and write it for munged; the path written."""
    return munge_key.install_key(paths, read_munge_secret(arn, region))


def write_config(paths: SlurmPaths, cluster_id: str, membership: Membership,
                 gpus: int) -> list[Path]:
    """slurm.conf, gres.conf and cgroup.conf of this node for ``membership``; returns the
    files whose bytes changed."""
    c = config.SlurmConfig(cluster_id=cluster_id, controller_address=membership.master.address,
                           root=str(paths.root), efs=str(paths.efs))
    files = {paths.slurm_conf: config.render_slurm_conf(c),
             paths.gres_conf: config.render_gres_conf(gpus, str(paths.root)),
             paths.cgroup_conf: config.render_cgroup_conf()}
    changed = []
    for path, text in files.items():
        if read_text(path) != text:
            atomic_write(path, text, mode=0o644)
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
                 scontrol: str = "scontrol") -> None:
        self.paths = paths
        self.cluster = cluster
        self.scontrol = scontrol
        #: Slurm node name -> instance id, of every member seen (a lost node's reason).
        self.known: dict[str, str] = {}

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
        actions = reconcile.plan(membership, listed, known=self.known,
                                 draining=draining_instances(self.cluster))
        return reconcile.apply(actions, self.scontrol, env)

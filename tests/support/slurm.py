"""Slurm's real daemons on emulated nodes without the stack: each node a root directory and
a 127.x address, its munge key written by the product, its units rendered by the product
(``bootstrap_scripts.slurm.units``), read as systemd reads them (``emulator.units``) and
started as the emulator starts them (``emulator.slurm_node``); its slurm.conf written by the
product for each membership this harness publishes. :meth:`SlurmNodes.stop` stops every
process it started (by their token: slurmstepd included)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts.agent.install import UNIT_DIR, python_unit
from bootstrap_scripts.node import node_region
from bootstrap_scripts.node.procgroup import alive
from bootstrap_scripts.protocol.membership import Membership, Node, alias_for
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import munge_key, node, reconcile, units
from emulator import slurm_node
from emulator.node_inputs import PYTHON, base_env
from emulator.units import unit_exec
from tests.conftest import REPO_ROOT

CLUSTER_ID = "slurmtest"


@contextlib.contextmanager
def slurm_work() -> Iterator[Path]:
    """A directory for the nodes whose every parent anyone may traverse: munged refuses a
    socket with a parent lacking execute permission for all (pytest's are 0700), and a
    user's srun reads the master's slurm.conf and reaches its munge socket."""
    work = Path(tempfile.mkdtemp(prefix="dlslurm-", dir="/tmp"))
    work.chmod(0o755)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class SlurmTestNode:
    role: str
    address: str
    instance_id: str
    root: Path
    gpus: int
    instance_type: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"ip-{self.address.replace('.', '-')}"


class SlurmNodes:
    """A handful of nodes under ``work``, their EFS ``work/efs``."""

    def __init__(self, work: Path, preload: Path) -> None:
        self.work = work
        self.efs = work / "efs"
        self.efs.mkdir(parents=True, exist_ok=True)
        self.preload = preload
        self.key = os.urandom(1024)
        self.nodes: list[SlurmTestNode] = []
        self.generation = 0
        self.addresses: set[str] = set()

    @property
    def master(self) -> SlurmTestNode:
        return self.nodes[0]

    def paths(self, n: SlurmTestNode) -> SlurmPaths:
        return SlurmPaths(n.root, self.efs)

    def add(self, role: str, address: str, *, gpus: int = 0,
            instance_type: str = "c5.xlarge") -> SlurmTestNode:
        n = SlurmTestNode(role, address, f"i-{os.urandom(8).hex()[:17]}",
                          self.work / address, gpus, instance_type)
        n.root.mkdir(parents=True)
        munge_key.install_key(self.paths(n), self.key)
        slurm_node.gpu_devices(n.root, gpus)
        region = node_region.env_file(n.root)
        region.parent.mkdir(parents=True, exist_ok=True)
        region.write_text(node_region.render_env_file("us-east-1"))
        rendered = units.render_units(
            python_unit, python=PYTHON, package_dir=str(REPO_ROOT), root=str(n.root),
            efs=str(self.efs), role=role, address=address, instance_type=instance_type,
            gpus=gpus, log_dir=str(n.root / "var/log/dl-cluster"))
        for name, text in rendered.items():
            path = n.root / UNIT_DIR / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        self.nodes.append(n)
        self.addresses.add(address)
        return n

    def membership(self) -> Membership:
        return Membership(cluster_id=CLUSTER_ID, generation=self.generation, nodes=tuple(
            Node(rank=i, role=n.role, instance_id=n.instance_id, address=n.address,
                 alias=alias_for(i), gpus=n.gpus, instance_type=n.instance_type)
            for i, n in enumerate(self.nodes)))

    def publish(self) -> Membership:
        """A new generation of the nodes now listed, applied by each (its slurm.conf)."""
        self.generation += 1
        m = self.membership()
        for n in self.nodes:
            node.write_config(self.paths(n), CLUSTER_ID, m, n.gpus)
        return m

    def start(self, n: SlurmTestNode) -> None:
        """What systemd starts on the node: its Slurm units, as the emulator runs them."""
        for name in (units.MUNGED_UNIT, units.SLURMCTLD_UNIT, units.SLURMD_UNIT):
            path = n.root / UNIT_DIR / name
            if not path.exists():
                continue
            argv, env = unit_exec(path.read_text(), name)
            n.procs.append(slurm_node.start(
                n.address, argv, {**base_env(), **env}, self.preload,
                n.root / "var/log/dl-cluster" / f"{name}.out", cwd=n.root))

    def lose(self, n: SlurmTestNode) -> None:
        """The machine is gone: every process of its Slurm killed; it leaves the list."""
        slurm_node.stop(n.address, sig=signal.SIGKILL, grace=0)
        self.nodes.remove(n)

    def env(self) -> dict[str, str]:
        """A client's environment on the master (its slurm.conf)."""
        return node.slurm_env(self.paths(self.master))

    def slurm_nodes(self) -> list[reconcile.SlurmNode] | None:
        return reconcile.list_nodes("scontrol", self.env())

    def wait_nodes(self, ok: Callable[[dict[str, reconcile.SlurmNode]], bool], what: str,
                   timeout: float = 60.0) -> dict[str, reconcile.SlurmNode]:
        """Until ``ok`` holds for Slurm's node list (by name); AssertionError after
        ``timeout`` naming ``what`` and the list."""
        deadline = time.monotonic() + timeout
        listed: dict[str, reconcile.SlurmNode] = {}
        while time.monotonic() < deadline:
            listed = {x.name: x for x in self.slurm_nodes() or []}
            if ok(listed):
                return listed
            time.sleep(0.25)
        raise AssertionError(f"{what}: not so after {timeout:g} s; Slurm lists {listed}; "
                             f"logs under {self.work}")

    def reconciler(self) -> node.Reconciler:
        return node.Reconciler(self.paths(self.master), ClusterPaths(self.efs))

    def stop(self) -> set[int]:
        """Stop every node's Slurm; the survivors, looked for in every namespace the
        daemons had (not only through what ``slurm_node.stop`` itself finds)."""
        spaces = set().union(*(slurm_node.namespaces(a) for a in self.addresses))
        left: set[int] = set()
        for address in sorted(self.addresses):
            left |= slurm_node.stop(address, grace=5.0)
        return left | {p for p in slurm_node.in_namespaces(spaces) if alive(p)}

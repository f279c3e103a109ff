"""One emulated node for the executor drills that need no cluster boot (tests/security: the
rendezvous store, its port, the listener guard): a node root and an EFS of its own that every
user can reach, a sticky world-writable ``markers`` directory, and a victim's torchrun job
planned as ``dl-run`` plans it, its spec written as the victim's."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bootstrap_scripts.jobs.engine import launchers as ln
from bootstrap_scripts.jobs.engine import user_dirs
from bootstrap_scripts.jobs.engine.plan_types import LaunchOptions
from bootstrap_scripts.jobs.executor import listen_guard
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.protocol.jobs import DEFAULT_RDZV_PORT, JobSpec, Share
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths, NodePaths
from emulator.nodes import PYTHON


def drill_address(second: int) -> str:
    """A loopback address of its own for a drill's node (``127.<second>.x.y``: no other
    test's ports)."""
    return f"127.{second}.{os.getpid() % 250 + 1}.{int(time.time() * 1000) % 250 + 1}"


@contextlib.contextmanager
def drill_node(prefix: str, second: int, train: str = "") -> Iterator[tuple[ThisNode, Path]]:
    """(the node, its directory); ``train``: the text of ``<dir>/train.py``, if any."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(tmp, 0o755)
    efs = tmp / "efs"
    (efs / "jobs").mkdir(parents=True)  # root's, one directory per user (user_dirs)
    (efs / "checkpoints").mkdir()  # as the executor prepares them (daemon.EFS_DIR_MODES)
    (tmp / "markers").mkdir()
    os.chmod(tmp / "markers", 0o1777)
    if train:
        (tmp / "train.py").write_text(train)
    this = ThisNode(NodePaths(tmp / "root"), ClusterPaths(efs), drill_address(second))
    try:
        yield this, tmp
    finally:  # the node's kernel rules go with it, as with an emulated machine
        listen_guard.forget(this.address)
        shutil.rmtree(tmp, ignore_errors=True)


def torchrun_job(this: ThisNode, user: pwd.struct_passwd, tmp: Path, job_prefix: str
                 ) -> tuple[JobSpec, Share, JobPaths]:
    """The victim's one-node torchrun job: the agent runs ``<tmp>/train.py <tmp>/markers``
    next to the job's own store."""
    m = build_membership(cluster_id="drill", generation=1, efs_mount=str(this.cluster.efs),
                         reason="drill", master={"instance_id": "i-0", "address": this.address,
                                                 "gpus": 0}, workers=[])
    job_id = f"{job_prefix}-{os.getpid()}-{int(time.time())}"
    paths = this.cluster.job(job_id, user.pw_name)
    opts = LaunchOptions(job_id=job_id, python=PYTHON, rdzv_port=DEFAULT_RDZV_PORT,
                         nproc_per_node=1, job_dir=str(paths.dir))
    plan = ln.plan("torchrun", m, ["python", str(tmp / "train.py"), str(tmp / "markers")],
                   opts)
    (share,) = plan.shares
    spec = JobSpec(job_id=job_id, launcher="torchrun", shares=(share,), cwd="/",
                   grace_seconds=2.0, env={"PATH": os.environ["PATH"]})
    user_dirs.ensure(this.cluster.efs, {user.pw_name: (user.pw_uid, user.pw_gid)})
    paths.dir.mkdir()
    os.chown(paths.dir, user.pw_uid, user.pw_gid)
    paths.spec.write_text(spec.to_json())
    os.chown(paths.spec, user.pw_uid, user.pw_gid)
    os.chmod(paths.spec, 0o600)
    return JobSpec.from_json(paths.spec.read_text()), share, paths

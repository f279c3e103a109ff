"""The launch plan's types: the options a plan is built from, the plan, its error.

Apart from :mod:`launchers` (the planners) so that every planner module, the TensorFlow one
included, imports them from here and none imports another planner module: no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bootstrap_scripts.protocol.jobs import DEFAULT_RDZV_PORT, Proc, Share
from bootstrap_scripts.protocol.run_request import (
    DEFAULT_MPI_IF_EXCLUDE,
    DEFAULT_NCCL_SOCKET_IFNAME,
)


class LaunchError(ValueError):
    """Options that cannot produce a valid command; the message names the bad value."""


@dataclass(frozen=True)
class LaunchOptions:
    job_id: str = "job"
    #: the job's directory on EFS (``ClusterPaths(efs).job(job_id).dir``); the runner sets it
    job_dir: str = ""
    python: str = "python3"
    # torchrun
    nnodes: str = ""  # "" = exactly the membership's node count; or "MIN:MAX"
    nproc_per_node: int = 0  # 0 = GPU count (1 on CPU nodes)
    max_restarts: int = 0
    rdzv_port: int = DEFAULT_RDZV_PORT
    #: elastic: nodes may join and leave while the job runs (see docs/elastic-training.md)
    elastic: bool = False
    #: seconds the rendezvous waits for more nodes once MIN are there (torchrun: 30)
    rdzv_last_call: float = 0.0
    # mpi / horovod
    mpirun: str = "mpirun"
    horovodrun: str = "horovodrun"
    mpi_if_include: str = ""  # when set, replaces the exclude list (e.g. "lo" in the emulator)
    mpi_if_exclude: str = DEFAULT_MPI_IF_EXCLUDE
    nccl_socket_ifname: str = DEFAULT_NCCL_SOCKET_IFNAME
    mpi_rsh_agent: str = ""  # e.g. "ssh -F /path/cfg"
    mpi_extra: tuple[str, ...] = ()
    forward_env: tuple[str, ...] = ()
    allow_run_as_root: bool = False
    # tf
    tf_mode: str = "worker"  # "worker" (multi-worker) | "ps" (parameter server)
    tf_port: int = 2222  # multi-worker port; the PS port in ps mode
    tf_worker_base_port: int = 2230
    # mxnet
    mxnet_launch: str = "launch.py"
    #: a pinned image every rank runs in (``dl-container``); "" for the node's own Python
    image: str = ""


@dataclass(frozen=True)
class LaunchPlan:
    launcher: str
    shares: tuple[Share, ...]
    master_only: bool
    files: dict[str, str] = field(default_factory=dict)  # relative to the job dir
    summary: str = ""
    #: elastic jobs: the share a node that joins later runs; ``{address}`` in its argv is
    #: replaced by the joining node's address (its executor builds its own share)
    join_template: Proc | None = None
    #: torchrun: ``--nnodes`` as the plan computed it (``N`` or ``MIN:MAX``, defaults
    #: applied), published in the job spec for the controller; "" for other launchers
    nnodes: str = ""


def python_command(command: list[str], python: str) -> list[str]:
    """Prefix the interpreter when the user gave a script or ``-m module`` (tf launcher)."""
    if command[0].endswith(".py") or command[0] == "-m":
        return [python, *command]
    return command

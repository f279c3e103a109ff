"""The run request: what to run and how, the only serialization of a job's options.

``dl-run --unmanaged`` builds it from its options; a managed job's ``request.json`` carries
it and the controller hands it to each attempt's runner; the health gate's node checks and
all-reduce are run requests too (docs/runner.md, "The front door"). Kept apart from the job
spec (:mod:`.jobs`, what every node's executor runs) so each reads in one sitting. Plain
Python only: runs on nodes without torch.
"""

from __future__ import annotations

from dataclasses import field
from typing import ClassVar

from bootstrap_scripts.containers.reference import BadReference
from bootstrap_scripts.containers.reference import parse as parse_image
from bootstrap_scripts.data import checksums
from bootstrap_scripts.data.checkpoint_plan import CheckpointError, parse_s3_url
from bootstrap_scripts.protocol.data_source import (
    DataSourceError,
    check_checksum_mode,
    check_mounts,
    parse_data_source,
)
from bootstrap_scripts.protocol.jobs import DEFAULT_RDZV_PORT, JobSpecError, checked_job_id
from bootstrap_scripts.protocol.nnodes import TORCHRUN
from bootstrap_scripts.protocol.record_base import Record, record

#: The interface flags the original Horovod cluster template passed to mpirun; right for real
#: clusters, where ``lo`` and ``docker0`` must not carry traffic. The loopback emulator
#: overrides them.
DEFAULT_MPI_IF_EXCLUDE = "lo,docker0"
DEFAULT_NCCL_SOCKET_IFNAME = "^docker0"
#: Variables of the runner's environment that every share inherits (the nodes are
#: identical machines, so the user's PATH / venv / conda env mean the same there).
FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX",
                 "CONDA_DEFAULT_ENV", "HOME", "USER", "LOGNAME")


@record
class RunRequest(Record):
    """What to run on a set of nodes, and how: the one description of a job, whoever asks.

    ``dl-run --unmanaged`` builds it from its options; a managed job's ``request.json``
    carries it (``ManagedRequest.run``) and the job controller hands it, per attempt, to the
    attempt's runner (``dl-run --unmanaged --request -``, on its standard input); the health
    gate's checks and all-reduce are run requests too. Where it runs (the membership, EFS)
    is not part of it."""

    KIND: ClassVar[str] = "run request"
    job_id: str
    command: tuple[str, ...]
    launcher: str = TORCHRUN
    #: every rank's environment (the variables dl-run forwards, then ``--env``)
    env: dict[str, str] = field(default_factory=dict)
    #: names mpirun must pass on to the ranks it starts (``-x``)
    forward: tuple[str, ...] = ()
    cwd: str = ""
    python: str = ""  # "": the runner's interpreter if it has torch, else python3
    # torchrun
    nnodes: str = ""
    nproc_per_node: int = 0
    torchrun_max_restarts: int = 0
    rdzv_port: int = DEFAULT_RDZV_PORT
    elastic: bool = False
    #: elastic attempts of a managed job: nodes join only once the job controller admitted
    #: them (``JobSpec.join_admission``: after its health gate)
    join_admission: bool = False
    rdzv_last_call: float = 0.0
    # mpi / horovod
    mpi_if_include: str = ""
    mpi_if_exclude: str = DEFAULT_MPI_IF_EXCLUDE
    nccl_socket_ifname: str = DEFAULT_NCCL_SOCKET_IFNAME
    mpi_rsh_agent: str = ""
    mpi_args: tuple[str, ...] = ()
    mpirun: str = "mpirun"
    horovodrun: str = "horovodrun"
    # tensorflow / mxnet
    tf_mode: str = "worker"
    tf_port: int = 2222
    mxnet_launch: str = "launch.py"
    # supervision
    grace: float = 5.0
    fail_grace: float = 10.0
    heartbeat_timeout: float = 10.0
    reach_timeout: float = 3.0
    start_timeout: float = 30.0
    orphan_timeout: float = 30.0
    prefix: bool = True
    #: managed jobs: seconds without progress on any rank (``bootstrap_scripts.progress``)
    #: before the job controller calls the attempt hung, dumps its stacks and restarts it;
    #: 0: never (docs/managed-jobs.md, "Hangs and stragglers")
    hang_timeout: float = 0.0
    # data in S3 (``dl-run --data``): staged on every node before the job starts
    #: ``s3://bucket/prefix[:/local/dir]``, "" for none
    data: str = ""
    #: each node stages only its share of the objects (rank modulo the node count)
    data_shard: bool = False
    #: ``--data-checksums``: ``warn`` stages the objects botocore cannot check against
    #: S3's checksum and counts them; ``required`` fails the staging on the first
    data_checksums: str = checksums.WARN
    #: ``s3://bucket/prefix:/dir`` each (``dl-run --mount``): mounted read-only with
    #: Mountpoint for Amazon S3 on every node before the job starts, unmounted after
    mounts: tuple[str, ...] = ()
    # checkpoints in S3 (``jobs/engine/checkpoints.py``), for a job with ``DL_CHECKPOINT_DIR``
    #: ``s3://bucket/prefix/`` the checkpoint directory is mirrored to ("" for none; a
    #: managed job's is set by the job controller)
    checkpoint_url: str = ""
    #: ``s3://bucket/prefix`` (``--resume-from``): another place the job may resume from
    resume_from: str = ""
    #: ``registry/repository[:tag]@sha256:...`` (``--image``): every rank runs in this image,
    #: pinned to its digest so every node and every restart runs the same bits ("": none)
    image: str = ""

    def __post_init__(self) -> None:
        checked_job_id(self.job_id)
        if self.image:
            check_image(self.image, self.launcher)
        if self.hang_timeout < 0:
            raise JobSpecError(f"--hang-timeout must be >= 0 s (0: off), got "
                               f"{self.hang_timeout}", field="hang_timeout")
        if self.data:
            parse_data_source(self.data)
        try:
            check_checksum_mode(self.data_checksums)
        except DataSourceError as exc:
            raise JobSpecError(str(exc), field="data_checksums") from None
        check_mounts(tuple(self.mounts))
        for name, url in (("checkpoint_url", self.checkpoint_url),
                          ("resume_from", self.resume_from)):
            if url:
                try:
                    parse_s3_url(url, "--resume-from" if name == "resume_from" else name)
                except CheckpointError as exc:
                    raise JobSpecError(str(exc), field=name) from None
        if not self.command:
            raise JobSpecError("no command given: put the training command after the options",
                               field="command")


def check_image_option(image: str, launcher: str) -> None:
    """``--image`` as given at submit: a well-formed reference, with torchrun; a tag alone is
    fine here (``dl-run`` resolves it to its digest before the request is made).
    JobSpecError naming what is wrong (``dlc submit`` checks it on the laptop)."""
    try:
        parse_image(image)
    except BadReference as exc:
        raise JobSpecError(str(exc), field="image") from None
    if launcher != TORCHRUN:
        raise JobSpecError(f"--image runs with the torchrun launcher only, not {launcher}",
                           field="image")


def check_image(image: str, launcher: str) -> None:
    """``--image`` as a request carries it: :func:`check_image_option`, and pinned to a
    digest (resolved at submit), so every node and every restart runs the same bits."""
    check_image_option(image, launcher)
    if not parse_image(image).pinned:
        raise JobSpecError(f"--image {image!r} is not pinned: give it as "
                           f"REPOSITORY[:TAG]@sha256:<digest>, or submit it with dl-run, "
                           f"which resolves the tag", field="image")


@record
class StagedNode(Record):
    """One node's staging of a job's ``--data`` (what ``data.stage`` reported)."""

    KIND: ClassVar[str] = "staged node"
    rank: int
    address: str
    directory: str
    objects: int
    copied: int
    bytes: int
    copied_bytes: int
    seconds: float
    gbps: float
    shard: str = ""
    #: objects copied without a checksum check (``data.checksums``; its log says why)
    unverified: int = 0


@record
class StagingReport(Record):
    """``jobs/<job-id>/staging.json``: where ``--data`` was staged on every node, and how
    fast (the staging itself is the job ``<job-id>.stage``)."""

    KIND: ClassVar[str] = "staging report"
    job_id: str
    source: str
    seconds: float
    nodes: tuple[StagedNode, ...] = ()

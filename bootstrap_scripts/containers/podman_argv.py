"""The ``podman run`` command line of one rank: the job's user inside, the host's network.

WHY each flag:

- ``--userns=keep-id``: the calling user's uid and gid inside, so files on EFS, in the job
  directory and in checkpoints are owned as outside; podman runs rootless as that user, and
  nothing here asks for more (no ``--privileged``, ``--cap-drop=all``,
  ``no-new-privileges``: a setuid binary in the image gains nothing).
- ``--network=host --ipc=host``: NCCL, torchrun's rendezvous and shared memory behave as on
  the host; it is the only network mode offered, so a rank's traffic leaves through the
  host's OUTPUT chain as the user and the IMDS guard's owner match holds for it.
- ``--pull=never``: the image is pulled before any rank starts (by digest); a rank never
  fetches, so every rank and every restart runs the same bits.
- ``--env NAME`` without a value: podman copies the value from its own environment, so
  values (tokens, paths) never appear in the process list.
- GPUs through the NVIDIA Container Toolkit's CDI name; other devices (EFA's
  ``/dev/infiniband/*``) by path.
- Mounts at the same path inside as outside (EFS, the job directory, data, checkpoints), so
  every path the job is given means the same thing in the container.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bootstrap_scripts.containers.reference import ImageRef

PODMAN = "podman"
GPU_DEVICE = "nvidia.com/gpu=all"
#: Variables passed into a rank by name: the product's, torchrun's, NCCL's, libfabric's (EFA),
#: PyTorch's and the SDK settings a job's own credentials are found through.
PASS_PREFIXES = ("DEEPLEARNING_", "DL_", "NCCL_", "TORCH_", "TORCHELASTIC_", "FI_", "CUDA_",
                 "PYTORCH_")
PASS_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
    "OMP_NUM_THREADS", "AWS_CONFIG_FILE", "AWS_REGION", "AWS_DEFAULT_REGION",
    "AWS_EC2_METADATA_DISABLED", "HOME", "USER", "LOGNAME",
})
#: Variables a job may hold but that must not cross into an image (the SDKs' static secrets
#: never reach a job; if one did, a prefix above must not carry it in).
NEVER_PASS = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                        "AWS_SECURITY_TOKEN"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ArgvError(ValueError):
    """A rank's container could not be described safely; the message says what."""


@dataclass(frozen=True)
class RankContainer:
    """What one rank's container needs from the node and the job."""

    image: ImageRef
    command: tuple[str, ...]
    workdir: str
    mounts: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    gpus: bool = False
    env_names: tuple[str, ...] = field(default=())


def passed_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The names of ``environ`` a rank receives, sorted."""
    return tuple(sorted(
        name for name in environ
        if name not in NEVER_PASS and _ENV_NAME.fullmatch(name)
        and (name in PASS_NAMES or name.startswith(PASS_PREFIXES))))


def _absolute(kind: str, path: str) -> str:
    if not path.startswith("/") or "\0" in path or ":" in path or "," in path:
        raise ArgvError(f"{kind} {path!r} must be an absolute path without ':' or ','")
    return path


def argv(rank: RankContainer, *, podman: str = PODMAN) -> list[str]:
    """The exact ``podman run`` argv; :class:`ArgvError` for an unpinned image or bad path."""
    if not rank.image.pinned:
        raise ArgvError(f"image {rank.image} is not pinned to a digest: resolve it at submit")
    if not rank.command:
        raise ArgvError("a rank needs a command to run in the image")
    args = [podman, "run", "--rm", "--pull=never", "--userns=keep-id", "--network=host",
            "--ipc=host", "--cap-drop=all", "--security-opt=no-new-privileges",
            f"--workdir={_absolute('working directory', rank.workdir)}"]
    for path in dict.fromkeys(rank.mounts):
        _absolute("mount", path)
        args.append(f"--volume={path}:{path}")
    if rank.gpus:
        args.append(f"--device={GPU_DEVICE}")
    for device in dict.fromkeys(rank.devices):
        if not device.startswith("/dev/"):
            raise ArgvError(f"device {device!r} is not under /dev")
        args.append(f"--device={_absolute('device', device)}")
    for name in rank.env_names:
        if not _ENV_NAME.fullmatch(name) or name in NEVER_PASS:
            raise ArgvError(f"environment variable {name!r} is not passed into an image")
        args.append(f"--env={name}")
    args.append(rank.image.pinned_name())
    args.extend(rank.command)
    return args


def mounts_for(paths: Iterable[str | None]) -> tuple[str, ...]:
    """The distinct absolute paths among ``paths`` (unset ones skipped), in order."""
    return tuple(dict.fromkeys(p for p in paths if p))

"""``dl-container run IMAGE@DIGEST -- CMD ...``: one rank's command inside the job's image.

``dl-container pull IMAGE@DIGEST`` puts the image in the user's store first
(:mod:`bootstrap_scripts.containers.pull`): ranks never fetch (``--pull=never``).
``dl-container resolve IMAGE:TAG`` prints the image pinned to the digest its tag names now
(:mod:`bootstrap_scripts.containers.resolve`, what ``dl-run --image`` does at submit).

The launchers wrap each rank's command in this (and a Slurm script writes
``srun dl-container run IMAGE -- CMD``). It runs as the job's own user, never as root: it
only turns the rank's environment into a rootless ``podman run`` argv
(:mod:`bootstrap_scripts.containers.podman_argv`) and replaces itself with podman, so the
rank's exit status and signals are podman's, which are the container's. Root refuses,
because a root podman would be a root daemon holding the user's image and command.

What it mounts, each at the same path inside as outside (only those that exist): the node's
EFS (``EFS_MOUNT``), the job's directory (``DL_JOB_DIR``), its data and checkpoint
directories (``DL_DATA_DIR``, ``DL_CHECKPOINT_DIR``), the directory of the job's AWS
settings (``AWS_CONFIG_FILE``'s) and the working directory. The GPUs go in by their CDI name
when the NVIDIA Container Toolkit's specification is on the node; EFA devices by path.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from bootstrap_scripts.containers import causes, podman_argv, pull, resolve
from bootstrap_scripts.containers.reference import BadReference, parse

#: Where ``nvidia-ctk cdi generate`` writes the GPUs' specification (static and generated).
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml")
EFA_DEVICES = "/dev/infiniband/uverbs*"
MOUNT_VARIABLES = ("EFS_MOUNT", "DL_JOB_DIR", "DL_DATA_DIR", "DL_CHECKPOINT_DIR")
EXIT_REFUSED = 2


def mounts(environ: Mapping[str, str], cwd: str,
           is_dir: Callable[[str], bool] = os.path.isdir) -> tuple[str, ...]:
    """The directories to mount: those that exist, outermost first, none under another."""
    wanted = [environ.get(name, "") for name in MOUNT_VARIABLES]
    config = environ.get("AWS_CONFIG_FILE", "")
    wanted += [os.path.dirname(config) if config.startswith("/") else "", cwd]
    paths = sorted({os.path.normpath(p) for p in wanted if p.startswith("/") and is_dir(p)},
                   key=lambda p: (p.count("/"), p))
    kept: list[str] = []
    for path in paths:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return tuple(kept)


def rank_container(image: str, command: Sequence[str], environ: Mapping[str, str], cwd: str,
                   *, is_dir: Callable[[str], bool] = os.path.isdir,
                   exists: Callable[[str], bool] = os.path.exists,
                   efa: Sequence[str] = ()) -> podman_argv.RankContainer:
    """The rank's container (``BadReference`` / ``ArgvError`` when it cannot be run)."""
    return podman_argv.RankContainer(
        image=parse(image), command=tuple(command), workdir=cwd,
        mounts=mounts(environ, cwd, is_dir), devices=tuple(efa),
        gpus=any(exists(spec) for spec in CDI_SPECS),
        env_names=podman_argv.passed_env(environ))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dl-container", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="run a command in a pinned image as the calling user")
    run.add_argument("image", help="registry/repository[:tag]@sha256:<digest>")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    pull = sub.add_parser("pull", help="put a pinned image in the calling user's store "
                          "(before any rank; nothing fetched when it is there)")
    pull.add_argument("image", help="registry/repository[:tag]@sha256:<digest>")
    pinned = sub.add_parser("resolve", help="print the image pinned to the digest its tag "
                            "names now (what dl-run --image does at submit)")
    pinned.add_argument("image", help="registry/repository[:tag]")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() == 0:
        print("dl-container: refusing to run as root: an image runs as the job's own user "
              "(rootless podman)", file=sys.stderr)
        return EXIT_REFUSED
    if args.verb in ("pull", "resolve"):
        try:
            image = parse(args.image)
        except BadReference as exc:
            print(f"dl-container: {exc}", file=sys.stderr)
            return EXIT_REFUSED
        if args.verb == "resolve":
            try:
                print(resolve.resolve(image), flush=True)
            except resolve.ResolveError as exc:
                print(f"error: dl-container resolve: {exc}", file=sys.stderr)
                return causes.EXIT_OF[exc.cause]
            return 0
        if not image.pinned:
            print(f"dl-container: image {image} is not pinned to a digest: resolve it at "
                  "submit", file=sys.stderr)
            return EXIT_REFUSED
        return pull.pull(image)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        rank = rank_container(args.image, command, os.environ, str(Path.cwd()),
                              efa=sorted(glob.glob(EFA_DEVICES)))
        line = podman_argv.argv(rank)
    except (BadReference, podman_argv.ArgvError) as exc:
        print(f"dl-container: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    sys.stdout.flush()
    try:
        os.execvp(line[0], line)
    except OSError as exc:
        print(f"dl-container: cannot start {line[0]}: {exc}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())

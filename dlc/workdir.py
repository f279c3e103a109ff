"""``dlc submit --workdir DIR``: ship a laptop directory to the job's own directory on EFS.

The directory is packed (a tar.gz, honouring every ``.gitignore`` and ``.dlcignore`` in it
with git's own rules; ``.git/`` is never shipped) and uploaded to the cluster's staging
bucket (the stack output ``WorkdirBucketName``, constructs_lib/workdir_staging.py) under
``workdirs/<user>/<random id>.tar.gz``. The submit command names only that key: Run
Command's parameters hold a few kilobytes, S3 holds the directory. On the master the
cluster's Command document fetches it as root and hands it to the user's ``dl-run``, which
unpacks it into ``managed/<user>/<job id>/workdir`` and runs the job there (docs/dlc.md).
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from dlc import aws
from dlc.errors import DlcError, UsageError
from dlc.target import Target

#: Ignore files read in every directory (a ``.dlcignore`` rule wins over a ``.gitignore``
#: one of the same directory; deeper directories' rules win over their parents').
IGNORE_FILES = (".gitignore", ".dlcignore")
#: Never shipped.
ALWAYS_IGNORED = ".git"
#: What the master fetches at most (bootstrap_scripts/jobs/cli/fetch_workdir.py).
MAX_BYTES = 2 * 1024 ** 3
#: The stack output naming the staging bucket.
BUCKET_OUTPUT = "WorkdirBucketName"


def _rules(directory: Path):
    """The directory's ignore rules (a pathspec GitIgnoreSpec), or None."""
    import pathspec

    lines: list[str] = []
    for name in IGNORE_FILES:
        try:
            lines += (directory / name).read_text(errors="replace").splitlines()
        except OSError:
            continue
    return pathspec.GitIgnoreSpec.from_lines(lines) if lines else None


def _ignored(rel: str, is_dir: bool, specs: list[tuple[str, object]]) -> bool:
    """Whether ``rel`` (relative to the root) is ignored: the deepest directory whose rules
    say anything about it decides."""
    for base, spec in reversed(specs):
        sub = rel[len(base) + 1:] if base else rel
        result = spec.check_file(sub + ("/" if is_dir else ""))
        if result.include is not None:
            return bool(result.include)
    return False


def collect(root: Path) -> list[str]:
    """The paths to ship, relative to ``root``, sorted (files and symbolic links; empty
    directories are not shipped, as git does not keep them)."""
    if not root.is_dir():
        raise UsageError(f"--workdir {root}: not a directory")
    out: list[str] = []

    def walk(directory: Path, rel: str, specs: list[tuple[str, object]]) -> None:
        spec = _rules(directory)
        specs = [*specs, (rel, spec)] if spec is not None else specs
        with os.scandir(directory) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                path = f"{rel}/{e.name}" if rel else e.name
                is_dir = e.is_dir(follow_symlinks=False)
                if e.name == ALWAYS_IGNORED or _ignored(path, is_dir, specs):
                    continue
                if is_dir:
                    walk(Path(e.path), path, specs)
                elif e.is_file(follow_symlinks=False) or e.is_symlink():
                    out.append(path)

    walk(root, "", [])
    return out


def pack(root: Path, files: list[str], into: Path,
         progress: Callable[[int, int], None] | None = None) -> int:
    """Write the tar.gz of ``files`` (relative to ``root``) to ``into``; its size."""
    with tarfile.open(into, "w:gz") as tar:
        for k, rel in enumerate(files, start=1):
            tar.add(root / rel, arcname=rel, recursive=False)
            if progress is not None:
                progress(k, len(files))
    return into.stat().st_size


def bucket(target: Target) -> str:
    stack = aws.describe_stack(target)
    name = stack.outputs.get(BUCKET_OUTPUT, "")
    if not name:
        raise DlcError(f"stack {target.stack} has no {BUCKET_OUTPUT} output (a cluster "
                       "deployed before --workdir existed): update it with dlc up, or put "
                       "the directory on EFS and use --cwd")
    return name


def upload(target: Target, archive: Path, name: str, key: str,
           advance: Callable[[int], None]) -> None:
    """``upload_file`` (multipart above 8 MB); its failures as :class:`dlc.errors.AwsError`
    (boto3 wraps the ClientError of a failed part in S3UploadFailedError)."""
    from boto3.exceptions import S3UploadFailedError

    what = f"S3 PutObject s3://{name}/{key}"
    try:
        aws.call(what, target.client("s3").upload_file, str(archive), name, key,
                 Callback=advance)
    except S3UploadFailedError as exc:
        raise aws.aws_error(exc.__cause__ or exc, what) from None


def stage(target: Target, root: Path, user: str, echo: Callable[[str], None]) -> str:
    """Pack and upload ``root``; ``<bucket>/<key>`` for the document's ``workdir``."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    root = root.expanduser().resolve()
    files = collect(root)
    if not files:
        raise UsageError(f"--workdir {root}: nothing to ship (empty, or every file ignored)")
    name = bucket(target)
    key = f"workdirs/{user}/{uuid.uuid4().hex}.tar.gz"
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    with tempfile.TemporaryDirectory(prefix="dlc-workdir-") as tmp, \
            Progress(*columns, console=Console(stderr=True)) as bar:
        archive = Path(tmp) / "workdir.tar.gz"
        packing = bar.add_task(f"packing {root}", total=len(files))
        size = pack(root, files, archive, lambda k, _n: bar.update(packing, completed=k))
        if size > MAX_BYTES:
            raise UsageError(f"--workdir {root} packs to {size} bytes, more than "
                             f"{MAX_BYTES}: ignore what the job does not need (.dlcignore) "
                             "or put the data on EFS")
        sending = bar.add_task(f"uploading to s3://{name}/{key}", total=size)
        upload(target, archive, name, key, lambda n: bar.advance(sending, n))
    echo(f"staged {len(files)} file(s), {size} bytes, as s3://{name}/{key}")
    return f"{name}/{key}"

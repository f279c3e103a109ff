"""Mirror a managed job's checkpoint directory on EFS to S3, and restore the newest one.

``python -m bootstrap_scripts.data.checkpoint_mirror watch --dir DIR --url s3://B/P/
[--local LOCAL]``
``python -m bootstrap_scripts.data.checkpoint_mirror restore --dir DIR --url s3://B/P/
[--from s3://OTHER/PREFIX]``

Both run as the job's user with the job's own credentials (the job role's, issued by the
node's executor: ``jobs/executor/job_credentials.py``), never root's: the engine starts
them as processes of the job's share on its first node (``jobs/engine/checkpoints.py``).

Why a mirror: EFS is one Availability Zone's file system in a single-AZ cluster and goes
with the stack when it is not kept; the checkpoint bucket is versioned, KMS-encrypted and
outlives the cluster, so a new cluster (``dlc submit --resume-from``) or an attempt whose
EFS copy is gone resumes from it.

- **watch** (a helper of the share, for as long as the job runs): every ``--every``
  seconds, and once more when it is stopped (SIGTERM: the job ended), uploads each complete
  checkpoint of ``DIR`` that S3 does not hold yet, oldest first, with boto3's transfer
  manager: its data files first, its manifest last (``checkpoint_plan``), so S3 never shows
  a complete checkpoint that is not. It records the last one in ``DIR/.dl-mirror.json``
  (``dl-jobs`` shows it). A failed pass is reported and retried at the next.
- **the node-local copy** (``--local LOCAL``, the job's ``DL_CHECKPOINT_LOCAL_DIR``): EFS's
  Elastic throughput bills every GB read as well as written, and reading a checkpoint back
  from EFS to upload it paid for its bytes a second time. When ``LOCAL`` (a directory on
  this node's own disk where the job wrote the same checkpoint first) holds a complete
  checkpoint whose manifest is the EFS one's, its data files are uploaded from there, and
  EFS is read only for the manifests and the listing. Anything else (no twin, another
  manifest, an incomplete twin, a twin pruned) is uploaded from EFS as before. The manifest
  uploaded is always the EFS one: S3 says complete only what EFS says is complete.
- **restore** (before an attempt starts): the newest complete checkpoint of ``DIR``, of
  ``--url`` and of each ``--from`` wins; one in S3 is fetched into ``DIR`` first (temporary
  names, synced to disk, then renamed; the manifest last). Checkpoints that are not
  complete (a missing manifest, a missing or short file) are ignored and reported.

The mirror never deletes in S3 (the job role may not; the bucket's lifecycle expires old
versions). Region: the node's region file, like the stager's.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path

from bootstrap_scripts.data import durable
from bootstrap_scripts.data.checkpoint_plan import (
    MANIFEST_SUFFIX,
    CheckpointError,
    Manifest,
    ResumeChoice,
    Survey,
    check_path,
    choose_resume,
    parse_s3_url,
    survey,
    upload_order,
    uploads,
)
from bootstrap_scripts.data.s3_errors import client_error
from bootstrap_scripts.node import node_region
from bootstrap_scripts.protocol import record_base, store
from bootstrap_scripts.protocol.errors import ProtocolError

#: The mirror's record of the last checkpoint it uploaded (hidden: never part of one).
STATUS_FILE = ".dl-mirror.json"
PART_SUFFIX = ".dl-part"
DEFAULT_EVERY = 10.0
DEFAULT_CONCURRENCY = 16


def say(message: str) -> None:
    print(f"dl-checkpoint: {message}", flush=True)


def s3_client(region: str, concurrency: int = DEFAULT_CONCURRENCY):
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", region_name=region or None,
        config=Config(max_pool_connections=concurrency + 4,
                      retries={"max_attempts": 5, "mode": "standard"}))


def local_listing(directory: Path) -> tuple[dict[str, str], dict[str, int]]:
    """(manifest file name -> text, data file path -> size) of ``directory``: regular files
    only (links are not followed), hidden names (temporary files, our status) skipped."""
    manifests: dict[str, str] = {}
    sizes: dict[str, int] = {}
    try:
        if not directory.is_dir():
            return manifests, sizes
    except OSError:  # another user's private directory (0700) on the way: nothing of ours
        return manifests, sizes
    for top, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = Path(top) / name
            rel = path.relative_to(directory).as_posix()
            if name.startswith("."):
                continue
            with contextlib.suppress(OSError):  # pruned while we looked, not ours to read,
                #                                  or no regular file of text (read_local)
                st = path.lstat()
                if not stat.S_ISREG(st.st_mode):
                    continue
                if rel.endswith(MANIFEST_SUFFIX) and "/" not in rel:
                    manifests[rel] = read_local(path)
                else:
                    sizes[rel] = st.st_size
    return manifests, sizes


#: The largest manifest or status file read (a manifest lists a checkpoint's files).
LOCAL_LIMIT = 1 << 20


def read_local(path: Path) -> str:
    """The text of a manifest or status file the job's user wrote, read as every record is
    (:func:`store.read_text`: no link followed, no FIFO waited on, a regular file of at
    most :data:`LOCAL_LIMIT` bytes); OSError for anything else, FileNotFoundError when
    there is none."""
    try:
        text = store.read_text(path, limit=LOCAL_LIMIT, errors="replace")
    except ProtocolError as exc:
        raise OSError(errno.EINVAL, str(exc)) from None
    if text is None:
        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
    return text


def s3_listing(client, bucket: str, prefix: str) -> tuple[dict[str, str], dict[str, int]]:
    """The same of ``s3://bucket/prefix``; a key with a ``..`` part is skipped."""
    manifests: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            try:
                check_path(rel)
            except CheckpointError:
                continue
            if rel.endswith(MANIFEST_SUFFIX) and "/" not in rel:
                body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"]
                manifests[rel] = body.read(1 << 20).decode(errors="replace")
            else:
                sizes[rel] = int(obj["Size"])
    return manifests, sizes


def s3_survey(client, url: str) -> Survey:
    bucket, prefix = parse_s3_url(url)
    return survey(*s3_listing(client, bucket, prefix))


def report_ignored(where: str, s: Survey) -> None:
    for name, why in s.ignored:
        say(f"ignored {where}{name}: {why}")


def twins(local: Path | None) -> dict[str, str]:
    """The complete checkpoints of the node-local copy ``local``: manifest file name -> the
    manifest as rendered (the same listing rules as EFS: regular files, no link followed,
    hidden names skipped; none when ``local`` is None or unreadable)."""
    if local is None:
        return {}
    return {m.manifest_file: m.render() for m in survey(*local_listing(local)).complete}


def source_of(m: Manifest, directory: Path, local: Path | None,
              local_twins: dict[str, str]) -> Path:
    """Where checkpoint ``m``'s data files are read from: ``local`` when it holds ``m``
    complete under the same manifest, else the EFS ``directory``."""
    if local is not None and local_twins.get(m.manifest_file) == m.render():
        return local
    return directory


def mirror_once(client, directory: Path, url: str,
                concurrency: int = DEFAULT_CONCURRENCY,
                local: Path | None = None) -> list[Manifest]:
    """Upload every complete checkpoint of ``directory`` that ``url`` lacks (module doc);
    the ones uploaded. Data files come from ``local``, the node-local copy, where it holds
    the same checkpoint (:func:`source_of`). A checkpoint pruned while it was being uploaded
    is left for the next pass (its manifest is never written without its files)."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    bucket, prefix = parse_s3_url(url)
    on_efs = survey(*local_listing(directory))
    remote_manifests, _ = s3_listing(client, bucket, prefix)
    local_twins = twins(local)
    done = []
    config = TransferConfig(max_concurrency=concurrency, use_threads=True)
    for m in uploads(on_efs, remote_manifests):
        *data, manifest = upload_order(m)
        source = source_of(m, directory, local, local_twins)
        try:
            with create_transfer_manager(client, config) as manager:
                futures = [manager.upload(str(source / p), bucket, prefix + p)
                           for p in data]
                for f in futures:
                    f.result()
        except FileNotFoundError as exc:
            say(f"{m.name} changed while it was uploaded ({exc.filename}): next pass")
            continue
        client.put_object(Bucket=bucket, Key=prefix + manifest, Body=m.render().encode(),
                          ContentType="application/json")
        done.append(m)
        say(f"mirrored {m.name} (global step {m.global_step}, "
            f"{sum(s for _, s in m.files)} bytes, read from "
            f"{'the node-local copy' if source != directory else 'EFS'}) to "
            f"s3://{bucket}/{prefix}")
    if done:
        write_status(directory, url, done[-1])
    return done


def write_status(directory: Path, url: str, m: Manifest) -> None:
    """``DIR/.dl-mirror.json``: the last checkpoint mirrored (temporary name + rename)."""
    record = {"url": url, "name": m.name, "global_step": m.global_step,
              "manifest": url + m.manifest_file, "mirrored_at": time.time()}
    tmp = directory / f".{STATUS_FILE}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, directory / STATUS_FILE)


def read_status(directory: Path) -> dict:
    """The mirror's record in ``directory`` ({} when there is none or it is unreadable)."""
    try:
        data = record_base.loads(read_local(directory / STATUS_FILE))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def fetch(client, m: Manifest, url: str, directory: Path) -> None:
    """Copy checkpoint ``m`` of ``url`` into ``directory``: each file under a temporary name,
    synced, then renamed; the directories synced; the manifest last (the same way). The
    manifest says "complete" to every later restore, so nothing it lists may still be only
    in memory when it appears: after a power loss a manifest whose file is short or zeros
    would be resumed from (``durable``; a checkpoint is a few large files, so a sync per
    file costs little beside its download)."""
    bucket, prefix = parse_s3_url(url)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    *data, manifest = upload_order(m)
    for rel in data:
        fetch_file(client, bucket, prefix + rel, directory / rel)
    for parent in sorted({(directory / rel).parent for rel in data}):
        durable.sync_dir(parent)
    fetch_file(client, bucket, prefix + manifest, directory / manifest)
    durable.sync_dir(directory)


@contextlib.contextmanager
def naming(where: str):
    """An S3 error as a restore's reason, with the place it failed at: a ``--resume-from``
    prefix the job role may not read is named, with ``AccessDenied`` (botocore's own text
    names only the operation)."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as exc:
        code, message = client_error(exc)
        code = "AccessDenied" if code in ("403", "Forbidden") else code
        raise CheckpointError(f"{where}: {code}: {message}") from exc


def fetch_file(client, bucket: str, key: str, final: Path) -> None:
    """One object to ``final``: a temporary name, synced, renamed."""
    final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    part = final.with_name(f".{final.name}{PART_SUFFIX}")
    with naming(f"s3://{bucket}/{key}"):
        client.download_file(bucket, key, str(part))
    durable.sync_file(part)
    os.replace(part, final)


def restore(client, directory: Path, urls: list[str]) -> ResumeChoice:
    """Make the newest complete checkpoint of ``directory`` and ``urls`` present in
    ``directory`` (module doc); the choice made."""
    local = survey(*local_listing(directory))
    report_ignored(f"{directory}/", local)
    others = []
    for url in urls:
        with naming(url):
            s = s3_survey(client, url)
        report_ignored(url, s)
        others.append((url, s))
    choice = choose_resume(local, str(directory), others)
    if choice.manifest is None:
        say(f"no complete checkpoint in {directory} or {', '.join(urls)}: a fresh start")
    elif choice.fetch:
        started = time.monotonic()
        fetch(client, choice.manifest, choice.source, directory)
        say(f"resuming from {choice.source}{choice.manifest.manifest_file} (global step "
            f"{choice.manifest.global_step}), fetched to {directory} in "
            f"{time.monotonic() - started:.1f} s")
    else:
        say(f"resuming from {directory}/{choice.manifest.manifest_file} (global step "
            f"{choice.manifest.global_step}, the newest)")
    return choice


def watch(client, directory: Path, url: str, every: float, stop: threading.Event,
          local: Path | None = None) -> None:
    """Mirror every ``every`` seconds until ``stop``, then one last pass."""
    while True:
        stopping = stop.wait(every)
        try:
            mirror_once(client, directory, url, local=local)
        except Exception as exc:  # botocore/OS errors: report, retry at the next pass
            say(f"mirror pass failed (retried in {every:g} s): {exc}")
        if stopping:
            return


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dl-checkpoint", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("watch", "restore", "once"))
    p.add_argument("--dir", required=True, help="the job's checkpoint directory on EFS")
    p.add_argument("--url", required=True, help="its mirror: s3://BUCKET/PREFIX/")
    p.add_argument("--local", default="", metavar="LOCAL",
                   help="watch, once: the node-local copy of the checkpoints, read instead "
                        "of EFS where it holds the same checkpoint")
    p.add_argument("--from", dest="sources", action="append", default=[],
                   metavar="s3://BUCKET/PREFIX", help="restore: another place to resume from")
    p.add_argument("--every", type=float, default=DEFAULT_EVERY,
                   help=f"watch: seconds between passes (default {DEFAULT_EVERY:g})")
    args = p.parse_args(argv)
    try:
        for url in (args.url, *args.sources):
            parse_s3_url(url)
    except CheckpointError as exc:
        p.error(str(exc))
    if not args.every > 0:
        p.error(f"--every must be a positive number of seconds, got {args.every!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    directory = Path(args.dir)
    local = Path(args.local) if args.local else None
    client = s3_client(node_region.read_installed(os.environ.get("DL_ROOT") or "/"))
    if args.action == "restore":
        try:
            restore(client, directory, [args.url, *args.sources])
        except Exception as exc:  # the attempt then does not start: say why
            # an ``error:`` line, as the stager's: the job's summary quotes the share's last
            # one (``summary.last_error_line``), so the cause reaches ``dlc logs`` and the
            # job's message, not only this log
            print(f"error: restore failed: {exc}", flush=True)
            return 1
        return 0
    if args.action == "once":
        mirror_once(client, directory, args.url, local=local)
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    # silent until it uploads: its log is one of the job's (``dl-jobs logs``), and a job
    # that writes no checkpoint should find no line of the mirror's there
    watch(client, directory, args.url, args.every, stop, local)
    return 0


if __name__ == "__main__":
    sys.exit(main())

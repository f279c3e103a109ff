"""The example job's checkpoints: written whole (data, then manifest last), loaded safely.

A checkpoint is ``epoch-NNNN.pt`` or ``step-NNNNNN.pt`` (``torch.save``, temp file +
rename) and then its manifest ``<name>.manifest.json`` (docs/protocol.md, "Checkpoint
manifests"): the manifest is written last, so a checkpoint is complete exactly when its
manifest lists its file with the size it has. The S3 mirror uploads and restores only
complete checkpoints by that rule (``bootstrap_scripts/data/checkpoint_plan.py``).
``latest.json`` still points at the newest (for tools and for checkpoints written before
manifests); the newest complete manifest wins over it, so a checkpoint fetched from S3
into the directory is resumed from.

A checkpoint is a file another program could have written, so loading one must not run
its code: it is loaded with ``torch.load(weights_only=True)`` (tensors and plain data
only), and only from the checkpoint directory itself: a manifest or ``latest.json`` must
name a checkpoint file in it (no path, no link), and both must belong to the user running
the job; anything else is ignored with a message.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

from bootstrap_scripts.data.checkpoint_plan import (
    MANIFEST_SUFFIX,
    CheckpointError,
    new_manifest,
    parse_manifest,
)

#: the names this job gives its checkpoints; a manifest or ``latest.json`` may point at
#: nothing else
CHECKPOINT_NAME_RE = re.compile(r"(epoch-\d{4,}|step-\d{6,})\.pt")


class UntrustedCheckpoint(Exception):
    """A manifest, ``latest.json`` or checkpoint this job did not write: never loaded."""


def atomic_write(final: Path, write) -> None:
    """``write(path)`` to a temporary name in ``final``'s directory, then rename it: a
    reader sees the whole old file or the whole new one (also ``digits_data``'s cache)."""
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.stem}-", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save_checkpoint(ckdir: Path, state: dict, name: str, keep: int,
                    local: Path | None = None) -> Path:
    """Write ``name``, then its manifest (last: the checkpoint is complete), point
    ``latest.json`` at it, prune old ones of its kind (manifest first: a pruned checkpoint
    is never complete). A reader sees a whole checkpoint or the previous one.

    ``local`` (``DL_CHECKPOINT_LOCAL_DIR``, a directory on this node's own disk): the
    checkpoint is written there first, data then manifest, and the EFS copy is made from
    it, so the S3 mirror on this node uploads the local bytes and never reads EFS back
    (``data/checkpoint_mirror.py``). Its manifest is in place before the EFS one, so the
    mirror never sees a complete EFS checkpoint whose twin is still being written."""
    import torch

    ckdir.mkdir(parents=True, exist_ok=True)
    final = ckdir / name
    if local is None:
        atomic_write(final, lambda tmp: torch.save(state, tmp))
    else:
        local.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(local / name, lambda tmp: torch.save(state, tmp))
        atomic_write(final, lambda tmp: shutil.copyfile(local / name, tmp))
    info = {"epoch": state["epoch"], "step": state["step"],
            "global_step": state["global_step"], "file": final.name,
            "run_id": state.get("run_id", ""), "acc": state.get("acc")}
    manifest = new_manifest(final.stem, int(state["global_step"]), time.time(),
                            [(final.name, final.stat().st_size)], info)
    for directory in (local, ckdir) if local is not None else (ckdir,):
        atomic_write(directory / manifest.manifest_file,
                     lambda tmp: Path(tmp).write_text(manifest.render()))
    atomic_write(ckdir / "latest.json", lambda tmp: Path(tmp).write_text(json.dumps(info)))
    kind = name.split("-", 1)[0]
    for directory in (ckdir, local) if local is not None else (ckdir,):
        for old in sorted(directory.glob(f"{kind}-*.pt"))[:-keep]:
            for path in (old.with_name(old.stem + MANIFEST_SUFFIX), old):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    return final


def open_own(ckdir: Path, name: str) -> int:
    """A descriptor of ``ckdir/name``: a regular file, not a link, owned by this user
    (FileNotFoundError when there is none)."""
    dfd = os.open(ckdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UntrustedCheckpoint(f"{ckdir / name}: {exc.strerror}") from None
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise UntrustedCheckpoint(f"{ckdir / name} is not a file of uid {os.geteuid()}")
    return fd


def _own_size(ckdir: Path, name: str) -> int:
    fd = open_own(ckdir, name)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def newest_manifest(ckdir: Path) -> dict | None:
    """The newest complete checkpoint by its manifest (module doc), as ``latest.json``'s
    record; None when there is none. Manifests that are not complete, not this user's
    own or name anything but their own checkpoint file are skipped with a message."""
    best: tuple[tuple[int, float], dict] | None = None
    with contextlib.suppress(OSError):
        names = [n for n in os.listdir(ckdir) if n.endswith(MANIFEST_SUFFIX)]
        for name in names:
            try:
                with os.fdopen(open_own(ckdir, name)) as fh:
                    m = parse_manifest(fh.read(1 << 20), name)
                ((file, size),) = m.files
                if file != m.name + ".pt" or not CHECKPOINT_NAME_RE.fullmatch(file):
                    raise UntrustedCheckpoint(f"{ckdir / name} lists {file!r}, not its own "
                                              f"checkpoint file")
                if _own_size(ckdir, file) != size:
                    continue  # not complete (being replaced): an older one is used
            except (UntrustedCheckpoint, CheckpointError) as exc:
                print(f"ignoring the checkpoint: {exc}", file=sys.stderr, flush=True)
                continue
            except (OSError, ValueError):  # gone meanwhile, or more than one file
                continue
            if best is None or m.order > best[0]:
                best = (m.order, {**m.meta, "file": file})
    return best[1] if best else None


def latest_info(ckdir: Path) -> dict | None:
    """The newest checkpoint's record with its ``path``: the newest complete manifest's,
    else ``latest.json``'s; None when there is none or it is not this user's own (then it
    says why on stderr)."""
    info = newest_manifest(ckdir)
    if info is not None:
        return {**info, "path": ckdir / info["file"]}
    try:
        with os.fdopen(open_own(ckdir, "latest.json")) as fh:
            info = json.loads(fh.read())
        name = info["file"]
        if not isinstance(name, str) or not CHECKPOINT_NAME_RE.fullmatch(name):
            raise UntrustedCheckpoint(f"{ckdir / 'latest.json'} points at {name!r}, "
                                      "not a checkpoint of this directory")
        os.close(open_own(ckdir, name))
    except UntrustedCheckpoint as exc:
        print(f"ignoring the checkpoint: {exc}", file=sys.stderr, flush=True)
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {**info, "path": ckdir / name}


def load_checkpoint(path: Path, device: object) -> dict:
    """The checkpoint's state, tensors and plain data only (``weights_only=True``: a
    pickled object in it is refused, never run), read from this user's own file."""
    import torch

    with os.fdopen(open_own(path.parent, path.name), "rb") as fh:
        return torch.load(fh, map_location=device, weights_only=True)


def latest_checkpoint(ckdir: Path) -> Path | None:
    info = latest_info(ckdir)
    return info["path"] if info else None

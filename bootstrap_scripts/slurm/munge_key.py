"""The cluster's munge key, written where munged reads it (root only).

munge trusts whoever holds the key: a process with it can forge any user's credential to
every Slurm daemon. So it is never on EFS (every node's users read EFS), never in the user
data, and on the node it is ``etc/munge/munge.key`` under the node's root, 0400 and owned by
``munge`` in a 0700 directory of munge's, as munged insists. The agent (root) reads it from
Secrets Manager with the node's role (``agent.aws.read_secret``) and writes it here before
munged starts.
"""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path

from bootstrap_scripts.protocol.slurm_paths import SlurmPaths

MUNGE_USER = "munge"
#: munged refuses keys shorter than this; Secrets Manager's value is at most 64 KiB.
MIN_KEY_BYTES, MAX_KEY_BYTES = 32, 65536


class MungeKeyError(ValueError):
    """A key munged would refuse, or no ``munge`` user to own it."""


def key_bytes(secret_string: str | None, secret_binary: bytes | None) -> bytes:
    """The key from a GetSecretValue answer: its binary value, else its string's bytes (the
    stack stores generated text, no JSON around it)."""
    raw = secret_binary if secret_binary else (secret_string or "").encode()
    if not MIN_KEY_BYTES <= len(raw) <= MAX_KEY_BYTES:
        raise MungeKeyError(f"the munge key has {len(raw)} bytes; munge needs "
                        f"{MIN_KEY_BYTES} to {MAX_KEY_BYTES}")
    return raw


def munge_ids() -> tuple[int, int]:
    try:
        return pwd.getpwnam(MUNGE_USER).pw_uid, grp.getgrnam(MUNGE_USER).gr_gid
    except KeyError:
        raise MungeKeyError("no 'munge' user on this node: is munge installed?") from None


def install_key(paths: SlurmPaths, key: bytes) -> Path:
    """Write ``key`` to the node's munge key file: 0400, owner munge, in a 0700 directory
    of munge's; written to a temporary file in that directory and renamed, so munged never
    reads half a key. Returns the path."""
    uid, gid = munge_ids()
    target = paths.munge_key
    directory = target.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(directory, uid, gid)
    directory.chmod(0o700)
    tmp = directory / f".{target.name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        os.chown(tmp, uid, gid)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target

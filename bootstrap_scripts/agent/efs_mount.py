"""Mount the cluster's EFS file system, retrying while its mount targets come up.

A node can boot before its subnet's EFS mount target is available (and before DNS for
``<fs-id>.efs.<region>.amazonaws.com`` resolves), so one failed mount is not fatal: we retry
with capped exponential backoff until a deadline, then raise :class:`MountError` whose
message names the file system, the mount point and the last error (the master turns it into
a FAILURE signal on the wait condition).

efs-utils (``mount -t efs -o tls,iam``) is preferred where installed: it encrypts in transit
and authenticates with the instance role (the file-system policy refuses anonymous and
non-TLS clients).
Otherwise plain NFS 4.1 with the options AWS recommends (the original's, plus
``noresvport`` so reconnects after a network blip use a fresh source port).

Errors that no retry can fix end the wait at once (:func:`final_error`): a plain-NFS mount
that the file system refuses (its policy requires TLS, which only ``mount.efs`` provides),
or a file-system type the host cannot mount at all.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

NFS_OPTIONS = "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport"

log = logging.getLogger(__name__)


class MountError(RuntimeError):
    """EFS could not be mounted; the message says which file system, where, and why."""


def mount_command(efs_id: str, region: str, mount_point: str) -> list[str]:
    """The mount command for this host: efs-utils with TLS if present, else NFS 4.1."""
    if shutil.which("mount.efs"):
        return ["mount", "-t", "efs", "-o", "tls,iam", f"{efs_id}:/", mount_point]
    return ["mount", "-t", "nfs4", "-o", NFS_OPTIONS,
            f"{efs_id}.efs.{region}.amazonaws.com:/", mount_point]


def final_error(cmd: list[str], error: str) -> str:
    """Why retrying ``cmd`` cannot succeed, or "" when the error may pass (DNS not yet
    resolving, the instance role not yet effective, a network blip)."""
    text = error.lower()
    if "unknown filesystem type" in text:
        return f"this host cannot mount file-system type {cmd[2]!r} (missing mount helper)"
    if cmd[2] == "nfs4" and "access denied" in text:
        # Anonymous NFS through a mount target is refused only by the file-system policy,
        # and the policy does not change while we wait.
        return ("the file system refused a mount without TLS: mount.efs (amazon-efs-utils) "
                "is not installed on this node, so it mounted with plain NFS, which a "
                "file-system policy that requires TLS refuses; use the Amazon Linux 2023 "
                "image (imageType amazon-linux-2023), an AMI with amazon-efs-utils, or a "
                "file system that does not require TLS")
    return ""


def is_mounted(mount_point: str) -> bool:
    """``mountpoint -q``: true only for a real mount, not for the empty directory under it."""
    exe = shutil.which("mountpoint")
    if exe is None:
        return os.path.ismount(mount_point)
    return subprocess.run([exe, "-q", mount_point], check=False).returncode == 0


def ensure_mounted(
    efs_id: str,
    region: str,
    mount_point: str,
    *,
    no_mount: bool = False,
    timeout: float = 900.0,
    first_delay: float = 2.0,
    max_delay: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
    logger: logging.Logger = log,
) -> str:
    """Make ``mount_point`` the EFS root; return how ("existing", "mounted", "directory")."""
    Path(mount_point).mkdir(parents=True, exist_ok=True)
    if no_mount:
        logger.info("event=efs-mount mode=directory mount_point=%s (--no-mount)", mount_point)
        return "directory"
    if is_mounted(mount_point):
        logger.info("event=efs-mount mode=existing mount_point=%s", mount_point)
        return "existing"
    if not efs_id:
        raise MountError(f"no --efs-id given and {mount_point} is not a mount point")
    if not efs_id.startswith("fs-"):
        raise MountError(f"--efs-id {efs_id!r} is not an EFS file system id (fs-...)")
    cmd = mount_command(efs_id, region, mount_point)
    deadline = time.monotonic() + timeout
    delay = first_delay
    attempt = 0
    last = ""
    while True:
        attempt += 1
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
            last = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
            ok = proc.returncode == 0 and is_mounted(mount_point)
        except (OSError, subprocess.TimeoutExpired) as exc:
            last, ok = repr(exc), False
        if ok:
            logger.info("event=efs-mount mode=mounted efs_id=%s mount_point=%s attempts=%d "
                        "command=%r", efs_id, mount_point, attempt, " ".join(cmd))
            return "mounted"
        final = final_error(cmd, last)
        if final:
            raise MountError(f"could not mount EFS {efs_id} at {mount_point}: {final}; "
                             f"error: {last}; command: {' '.join(cmd)}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise MountError(
                f"could not mount EFS {efs_id} at {mount_point} after {attempt} attempts "
                f"over {timeout:.0f}s; last error: {last}; command: {' '.join(cmd)}"
            )
        logger.warning("event=efs-mount-retry efs_id=%s attempt=%d retry_in=%.0fs error=%r",
                       efs_id, attempt, min(delay, remaining), last[:300])
        sleep(min(delay, remaining))
        delay = min(delay * 2, max_delay)

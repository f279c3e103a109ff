"""``dl-run --mount s3://bucket/prefix:/dir``: the job's S3 data, streamed through a FUSE mount.

The node's root job executor mounts each ``--mount`` of a job with Mountpoint for Amazon S3
(``mount-s3``, installed by the node's user data) before it starts the job's share on the
node, and unmounts it when the share ends. WHY root: a FUSE mount by the job's user would
need ``/dev/fuse`` and ``fusermount3`` rights the node does not give users; root mounts
for them, so root must not trust anything of theirs:

- the directory is the user's own: it is reached component by component from ``/`` as the
  user (``openat`` with ``O_NOFOLLOW``: no link anywhere on the way), and its ``fstat`` owner
  must be the job's user; it is not a system directory (``protocol.data_source``) nor already
  a mount point;
- mount-s3 is given that very directory, not its name: the descriptor is inherited and the
  target is ``/proc/self/fd/<n>``, so a rename or a link planted after the check changes
  nothing (the mount goes on the inode that was checked);
- the unmount names the mount through the parent directory's descriptor with
  ``UMOUNT_NOFOLLOW``; a mount point cannot be renamed while mounted (``EBUSY``), so that
  name is the mount;
- mount-s3's credentials are the job's (the job role's session tagged with the job's user,
  ``job_credentials.py``), never the node's: its environment has no ``AWS_*`` credential of
  the executor, instance metadata is off (``AWS_EC2_METADATA_DISABLED``), and
  ``AWS_CONFIG_FILE`` names root's own copy of the job's config, whose
  ``credential_process`` the executor rewrites before the session ends (Mountpoint reads
  credentials as the AWS CLI does: https://github.com/awslabs/mountpoint-s3/blob/main/doc/CONFIGURATION.md#aws-credentials);
- the mount is read-only and only the job's user may read it: ``--uid/--gid`` of the user,
  ``--dir-mode 0500 --file-mode 0400`` and ``--allow-other`` (without it nobody but root
  could read a mount root made).

mount-s3 runs in the foreground (``--foreground``), a child of the executor: the mount
lives as long as that process, and its output goes to the job's node log
(``mount.<n>``). A node without mount-s3 (the emulator has none: it cannot run FUSE) fails
the share before any process of the job starts, saying so.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.executor.job_credentials import STRIPPED, JobCredentials
from bootstrap_scripts.protocol.data_source import DataSource, check_mounts
from bootstrap_scripts.protocol.paths import JobPaths

LOG = logging.getLogger("dl-executor")

#: Mountpoint for Amazon S3's command, as its packages install it (``/usr/bin/mount-s3``).
MOUNT_S3 = "mount-s3"
#: Only the job's user may list and read the mount (its ``--uid`` / ``--gid``).
DIR_MODE = "0500"
FILE_MODE = "0400"
#: Seconds mount-s3 has to mount (it checks the bucket first) before the share fails.
READY_TIMEOUT_SECONDS = 60.0
#: Seconds mount-s3 has to exit after its unmount before it is killed.
STOP_TIMEOUT_SECONDS = 10.0
#: umount2(2) flags: detach even if a process still has a file open; never follow a link.
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class MountError(RuntimeError):
    """A ``--mount`` that cannot be made; the message names the directory and the cause."""


def mount_argv(source: DataSource, target: str, *, uid: int, gid: int, region: str,
               cache_dir: str = "") -> list[str]:
    """mount-s3's command line for ``source`` at ``target`` (options: ``mount-s3 --help``,
    https://github.com/awslabs/mountpoint-s3/blob/main/doc/CONFIGURATION.md)."""
    argv = [MOUNT_S3, source.bucket, target, "--read-only", "--foreground",
            "--allow-other", "--uid", str(uid), "--gid", str(gid),
            "--dir-mode", DIR_MODE, "--file-mode", FILE_MODE]
    if source.prefix:
        argv += ["--prefix", source.prefix]
    if region:  # the bucket's region is the cluster's (no lookup through instance metadata)
        argv += ["--region", region]
    if cache_dir:
        argv += ["--cache", cache_dir]
    return argv


def mount_env(base: dict[str, str], creds: JobCredentials) -> dict[str, str]:
    """mount-s3's environment: ``base`` without any credential of the node's, instance
    metadata off, and root's copy of the job's config as the only source of credentials."""
    env = {k: v for k, v in base.items() if k not in STRIPPED}
    env.update({"AWS_CONFIG_FILE": str(creds.mount_config_file),
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "AWS_EC2_METADATA_DISABLED": "true"})
    return env


@dataclass
class Pinned:
    """A checked mount directory: its parent's and its own descriptors, and its device."""

    path: str
    parent_fd: int
    name: str
    dir_fd: int
    dev: int

    def close(self) -> None:
        for fd in (self.dir_fd, self.parent_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def pin_directory(path: str, uid: int, gid: int) -> Pinned:
    """Open ``path`` as the user, no link followed on the way, and check it is a directory
    of ``uid`` that is not a mount point already; MountError naming it otherwise."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise MountError("--mount needs a directory other than /")
    fds: list[int] = []
    try:
        with userfiles.as_user(uid, gid):
            fds.append(os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in parts:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        link = exc.errno in (errno.ELOOP, errno.ENOTDIR)
        why = "a symbolic link or a non-directory is on the way" if link else exc.strerror
        raise MountError(f"--mount directory {path}: cannot open it as the job's user ({why}); "
                         f"create it first (mkdir -p {path}) as that user") from None
    dir_fd, parent_fd = fds.pop(), fds.pop()
    for fd in fds:
        os.close(fd)
    own, parent = os.fstat(dir_fd), os.fstat(parent_fd)
    pinned = Pinned(path, parent_fd, parts[-1], dir_fd, own.st_dev)
    if not stat.S_ISDIR(own.st_mode) or own.st_uid != uid:
        pinned.close()
        raise MountError(f"--mount directory {path} belongs to uid {own.st_uid}, not to the "
                         f"job's user (uid {uid}): root mounts only on a directory of yours")
    if own.st_dev != parent.st_dev:
        pinned.close()
        raise MountError(f"--mount directory {path} is a mount point already")
    return pinned


def unmount_path(parent_fd: int, name: str) -> str:
    """The path that names the mount on ``name`` in the pinned parent directory."""
    return f"/proc/self/fd/{parent_fd}/{name}"


def _umount2(path: str, flags: int) -> int:
    """umount2(2); 0 or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), flags) == 0:
        return 0
    return ctypes.get_errno()


@dataclass
class Mounted:
    """One mount of a job on this node: its directory and its mount-s3 process."""

    pinned: Pinned
    process: subprocess.Popen


@dataclass
class S3Mounts:
    """The S3 mounts of the jobs running on this node, keyed by job id."""

    region: str = ""
    umount2: Callable[[str, int], int] = _umount2
    jobs: dict[str, list[Mounted]] = field(default_factory=dict)

    def mount(self, job_id: str, mounts: Sequence[str], rank: int, paths: JobPaths, uid: int,
              gid: int, creds: JobCredentials | None, base_env: dict[str, str]) -> None:
        """Mount every ``mounts`` entry for the job's user, or none (MountError: the ones
        made are unmounted again)."""
        if not mounts:
            return
        sources = check_mounts(tuple(mounts))
        if shutil.which(MOUNT_S3, path=base_env.get("PATH", os.defpath)) is None:
            raise MountError(f"{MOUNT_S3} is not available on this node (Mountpoint for Amazon "
                             f"S3, installed by the node's user data); --mount cannot be "
                             f"used here, --data stages the same data instead")
        if creds is None:
            raise MountError("--mount needs the job's own AWS credentials (the cluster's job "
                             "role), and this job has none; the node's are never used")
        if job_id in self.jobs:  # one share per job and node: never a second set on top
            raise MountError(f"job {job_id} has its mounts on this node already")
        made = self.jobs.setdefault(job_id, [])
        try:
            for index, source in enumerate(sources):
                made.append(self._mount_one(source, index, rank, paths, uid, gid,
                                            mount_env(base_env, creds)))
        except BaseException:
            self.release(job_id)
            raise

    def _mount_one(self, source: DataSource, index: int, rank: int, paths: JobPaths, uid: int,
                   gid: int, env: dict[str, str]) -> Mounted:
        pinned = pin_directory(source.local_dir, uid, gid)
        log_path = paths.log(rank, f"mount.{index}")
        try:
            with userfiles.as_user(uid, gid):
                log_fd = userfiles.open_append(log_path)
            argv = mount_argv(source, f"/proc/self/fd/{pinned.dir_fd}", uid=uid, gid=gid,
                              region=self.region)
            with os.fdopen(log_fd, "ab", buffering=0) as log:
                log.write(f"dl-executor: {' '.join(argv)}  ({source.local_dir})\n".encode())
                process = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=subprocess.STDOUT,
                                           pass_fds=(pinned.dir_fd,), start_new_session=True)
        except OSError as exc:
            pinned.close()
            raise MountError(f"--mount {source.url} on {source.local_dir}: cannot start "
                             f"{MOUNT_S3}: {exc}") from None
        mounted = Mounted(pinned, process)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not self.is_mounted(pinned):
            if process.poll() is not None or time.monotonic() > deadline:
                self.unmount(mounted)
                how = (f"exited with code {process.returncode}" if process.returncode
                       is not None else f"did not mount within {READY_TIMEOUT_SECONDS:.0f} s")
                raise MountError(f"--mount {source.url} on {source.local_dir}: {MOUNT_S3} "
                                 f"{how} (its output: {log_path.name})")
            time.sleep(0.1)
        LOG.info("mounted %s on %s (read-only, uid %d)", source.url, source.local_dir, uid)
        return mounted

    @staticmethod
    def is_mounted(pinned: Pinned) -> bool:
        """Whether the pinned directory's name now leads to another file system."""
        try:
            st = os.stat(pinned.name, dir_fd=pinned.parent_fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_dev != pinned.dev

    def unmount(self, m: Mounted) -> None:
        """Unmount through the pinned parent (no link followed), then end mount-s3. Tried
        whatever ``is_mounted`` says: a mount whose mount-s3 died cannot be stat'ed
        (``ENOTCONN``) and must go all the same; where nothing is mounted the kernel
        answers ``EINVAL`` (a mount point cannot be renamed, and only root makes one)."""
        err = self.umount2(unmount_path(m.pinned.parent_fd, m.pinned.name),
                           MNT_DETACH | UMOUNT_NOFOLLOW)
        if err and err != errno.EINVAL:
            LOG.error("unmount of %s failed: %s", m.pinned.path, os.strerror(err))
        try:
            m.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            m.process.kill()
            m.process.wait()
        m.pinned.close()

    def release(self, job_id: str) -> None:
        """The job's share ended (or never started): unmount all its mounts."""
        for m in reversed(self.jobs.pop(job_id, [])):
            self.unmount(m)


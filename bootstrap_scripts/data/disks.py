"""Where staged data goes: the fastest local disk of the node, and whether it has room.

The choice (``choose_disk``, a pure function of the mount table):

1. an **instance-store NVMe** file system (the instance's own SSDs: the fastest storage it
   has, gone when the instance stops), the one with the most free space. A device is
   instance store when its NVMe model says so ("Amazon EC2 NVMe Instance Storage"; EBS
   volumes say "Amazon Elastic Block Store":
   https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ssd-instance-store.html), or it is a
   RAID array (``/dev/md*``) of only such devices (the Deep Learning AMI assembles them at
   ``/opt/dlami/nvme``);
2. else the **root volume** (encrypted gp3, ``rootVolumeGiB``), under ``/var/tmp``, which
   the operating system keeps across reboots (``/tmp`` may be a RAM file system).

Only mounts under the node root count (``/`` on a real node), and only ones this user can
write to. The data goes to ``<disk>/dl-data-<user>/<bucket>/<prefix>``: a directory per user,
made by that user (0700), refused if it is a symlink or someone else's.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts.data.plan import StageError, size_text

INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"
ROOT_VOLUME_DIR = "var/tmp"
#: Room kept free beyond the data (logs, the job's own files).
HEADROOM_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Mount:
    device: str
    mount_point: str
    instance_store: bool
    free_bytes: int
    writable: bool


def choose_disk(mounts: list[Mount], root: str) -> tuple[str, str]:
    """(directory, why) of the fastest local disk under ``root`` (module doc)."""
    base = os.path.normpath(root)
    under = [m for m in mounts if m.instance_store and m.writable and (
        base == "/" or m.mount_point == base or m.mount_point.startswith(base + "/"))]
    if under:
        best = max(under, key=lambda m: m.free_bytes)
        return best.mount_point, f"instance-store NVMe {best.device}"
    return os.path.join(base, ROOT_VOLUME_DIR), "root volume (no instance store mounted)"


def _model(name: str) -> str:
    """The NVMe model of block device ``name`` (a partition: of its disk), or ""."""
    block = Path("/sys/class/block") / name
    for path in (block / "device" / "model", block.resolve().parent / "device" / "model"):
        try:
            return path.read_text().strip()
        except OSError:
            continue
    return ""


def is_instance_store(device: str) -> bool:
    name = os.path.basename(device)
    if name.startswith("md"):
        members = [p.name for p in (Path("/sys/class/block") / name / "slaves").glob("*")]
        return bool(members) and all(_model(m) == INSTANCE_STORE_MODEL for m in members)
    return name.startswith("nvme") and _model(name) == INSTANCE_STORE_MODEL


def node_mounts(mounts_file: str = "/proc/self/mounts") -> list[Mount]:
    """This machine's block-device mounts, with what ``choose_disk`` needs."""
    out = []
    try:
        lines = Path(mounts_file).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) < 2 or not fields[0].startswith("/dev/"):
            continue
        device, point = fields[0], fields[1].replace("\\040", " ")
        try:
            st = os.statvfs(point)
        except OSError:
            continue
        out.append(Mount(device, point, is_instance_store(device), st.f_bavail * st.f_frsize,
                         os.access(point, os.W_OK | os.X_OK)))
    return out


def free_mib(path: str | os.PathLike) -> int:
    """Free MiB on ``path``'s filesystem as a non-root writer may use it (``f_bavail``: the
    reserved blocks left out); -1 when it cannot be measured. The node-local disk's figure
    the executor heartbeat and the health gate's ``disk`` check report. A directory not made
    yet is measured on the nearest one above it that exists (the same filesystem it will be
    on, unless something is mounted there later)."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        st = os.statvfs(where)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize // (1 << 20)


def default_destination(root: str, bucket: str, prefix: str) -> Path:
    """``<fastest disk>/dl-data-<user>/<bucket>/<prefix>``."""
    disk, why = choose_disk(node_mounts(), root)
    user = pwd.getpwuid(os.geteuid()).pw_name
    print(f"dl-stage: local disk: {disk} ({why})", flush=True)
    return Path(disk) / f"dl-data-{user}" / bucket / prefix.rstrip("/")


def make_own_dir(dest: Path) -> None:
    """Create ``dest`` (and parents) as this user; refuse a ``dl-data-<user>`` directory
    that is a symlink or not ours (someone else planted it in a shared directory)."""
    dest = Path(os.path.normpath(dest))
    for parent in [*reversed(dest.parents), dest]:
        if parent.name.startswith("dl-data-") or parent == dest:
            try:
                parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise StageError(f"cannot create {parent}: {exc.strerror}") from None
            st = os.lstat(parent)
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) \
                    or st.st_uid != os.geteuid():
                raise StageError(f"{parent} is not a directory of this user "
                                 f"(uid {os.geteuid()}): refusing to stage into it")


def check_space(dest: Path, needed: int, count: int) -> None:
    """StageError unless the file system of ``dest`` has room for ``needed`` bytes."""
    st = os.statvfs(dest)
    free = st.f_bavail * st.f_frsize
    if needed + HEADROOM_BYTES > free:
        raise StageError(f"{dest}: not enough space for {count} object(s): needs "
                         f"{size_text(needed)} (+{HEADROOM_BYTES // 2**20} MiB headroom), "
                         f"{size_text(free)} free: give a bigger disk with "
                         f"--data s3://...:/local/dir, or --data-shard")

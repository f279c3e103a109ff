"""Slurm and munge built from their source on a node whose image has no package of them.

The Amazon Linux 2023 Deep Learning AMI (the cluster's default image) ships neither Slurm nor
munge, and Amazon Linux 2023's repository has no package of them. A node of a cluster with
``scheduler=slurm`` on that image runs this module once at boot, from its user data
(``ImageFamily.slurm_install`` in ``constructs_lib/images.py``), as root, before the node
agent starts; an image that has ``slurmd`` skips it. docs/slurm-stack.md, "Slurm on the
image", argues the choice (and why there is no shared build cache on EFS).

Each source is pinned by version and SHA-256 and refused unless its bytes match, so what runs
as root on every node is exactly the reviewed release: munge 0.5.15 (its digest is the one
Debian's signed source package lists for the same upstream tarball) and Slurm 23.11.11
(SchedMD's release tag, the digest of Spack's recipe), the 23.11 line Ubuntu 24.04 packages.
Everything happens on the node's own disk (``--work-dir``). Standard library only: it runs
with the image's Python before anything else is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Where the sources are fetched and built (the node's local disk, never EFS).
DEFAULT_WORK_DIR = Path("/var/tmp/dl-slurm-build")
#: Seconds one download may take.
DOWNLOAD_TIMEOUT_SECONDS = 300
#: Attempts of each download, and the first wait between two (doubling): the network of a
#: node that just booted can still refuse a first request.
DOWNLOAD_ATTEMPTS = 4
DOWNLOAD_FIRST_DELAY_SECONDS = 5
_CHUNK = 1 << 20


class BuildError(Exception):
    """A source that could not be fetched, checked or built; the message says which."""


@dataclass(frozen=True)
class Source:
    """One pinned source release and how it is configured."""

    name: str
    version: str
    url: str
    sha256: str
    configure: tuple[str, ...]
    #: the system user its daemons run as (made when missing, as the OS's package would)
    user: str
    home: str

    @property
    def archive(self) -> str:
        return self.url.rsplit("/", 1)[-1]


MUNGE = Source(
    "munge", "0.5.15",
    "https://github.com/dun/munge/releases/download/munge-0.5.15/munge-0.5.15.tar.xz",
    "3f979df117a34c74db8fe2835521044bdeb08e3b7d0f168ca97c3547f51da9ba",
    ("--prefix=/usr", "--sysconfdir=/etc", "--localstatedir=/var", "--runstatedir=/run"),
    user="munge", home="/var/lib/munge")
SLURM = Source(
    "slurm", "23.11.11",
    "https://github.com/SchedMD/slurm/archive/slurm-23-11-11-1.tar.gz",
    "e9234e664ce30be206f73c0ff1a5f33e0ce32be35ece812eac930fcaa9da2c2f",
    ("--prefix=/usr", "--sysconfdir=/etc/slurm", "--localstatedir=/var",
     "--with-munge=/usr", "--enable-multiple-slurmd"),
    user="slurm", home="/var/lib/slurm")
#: Built in this order (Slurm links against munge).
SOURCES: tuple[Source, ...] = (MUNGE, SLURM)

Opener = Callable[..., object]


def fetch(source: Source, directory: Path, opener: Opener = urllib.request.urlopen,
          sleep: Callable[[float], None] = time.sleep) -> Path:
    """The source's archive in ``directory``, its SHA-256 checked; a mismatch removes the
    file and raises :class:`BuildError` naming the URL and both digests (not retried: the
    same URL would give the same bytes). A failed download is tried again."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / source.archive
    delay = DOWNLOAD_FIRST_DELAY_SECONDS
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        digest = hashlib.sha256()
        try:
            with opener(source.url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response, \
                    open(target, "wb") as out:  # type: ignore[attr-defined]
                while chunk := response.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            break
        except OSError as exc:
            target.unlink(missing_ok=True)
            if attempt == DOWNLOAD_ATTEMPTS:
                raise BuildError(f"{source.name} {source.version}: cannot download "
                                 f"{source.url} ({attempt} attempts): {exc}") from exc
            print(f"dl-slurm-build: {source.url}: {exc}; again in {delay} s", flush=True)
            sleep(delay)
            delay *= 2
    if digest.hexdigest() != source.sha256:
        target.unlink(missing_ok=True)
        raise BuildError(f"{source.name} {source.version}: {source.url} has SHA-256 "
                         f"{digest.hexdigest()}, expected {source.sha256}; refused")
    return target


def unpack(archive: Path, directory: Path) -> Path:
    """The archive's one top directory, unpacked under ``directory`` with tarfile's ``data``
    filter (nothing outside it, no devices, no set-uid bits)."""
    with tarfile.open(archive) as tar:
        tops = {Path(m.name).parts[0] for m in tar.getmembers() if m.name not in ("", ".")}
        if len(tops) != 1:
            raise BuildError(f"{archive.name}: expected one top directory, found {sorted(tops)}")
        try:
            tar.extractall(directory, filter="data")
        except tarfile.FilterError as exc:
            raise BuildError(f"{archive.name}: refused to unpack: {exc}") from exc
    return directory / tops.pop()


def build_steps(source: Source, jobs: int) -> list[list[str]]:
    """The commands that build and install ``source`` from its unpacked directory."""
    return [["./configure", *source.configure], ["make", f"-j{max(1, jobs)}"],
            ["make", "install"], ["ldconfig"]]


def ensure_user(source: Source, run: Callable[..., object] = subprocess.run) -> None:
    """The system user the source's daemons run as, made as its OS package would."""
    try:
        pwd.getpwnam(source.user)
    except KeyError:
        run(["useradd", "--system", "--home-dir", source.home, "--shell", "/sbin/nologin",
             "--comment", source.name, source.user], check=True)


def build(sources: Sequence[Source], work_dir: Path, jobs: int,
          opener: Opener = urllib.request.urlopen,
          run: Callable[..., object] = subprocess.run) -> None:
    """Fetch, check, unpack, build and install each source in order; BuildError on the
    first failure (the boot stops there: a node without Slurm cannot serve a Slurm job)."""
    for source in sources:
        print(f"dl-slurm-build: {source.name} {source.version}", flush=True)
        archive = fetch(source, work_dir, opener)
        tree = unpack(archive, work_dir / f"{source.name}-build")
        ensure_user(source, run)
        for step in build_steps(source, jobs):
            try:
                run(step, cwd=tree, check=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                raise BuildError(f"{source.name} {source.version}: {' '.join(step)} "
                                 f"failed: {exc}") from exc
    shutil.rmtree(work_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dl-slurm-build", description="Build munge and Slurm from their pinned, "
        "checksummed sources and install them (an image without their packages).")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    try:
        build(SOURCES, args.work_dir, args.jobs)
    except BuildError as exc:
        print(f"dl-slurm-build: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

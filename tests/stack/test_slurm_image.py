"""Slurm on the image (docs/slurm-stack.md): what each OS family's user data installs with
``scheduler=slurm`` (the synthesized Amazon Linux cluster's: tests/stack/test_slurm_stack.py),
and the source build of an image without packages (``bootstrap_scripts/agent/slurm_build.py``):
pinned digests, refused bytes, safe unpacking, the build's commands run in order."""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from bootstrap_scripts.agent import slurm_build as sb
from constructs_lib.images import IMAGE_FAMILIES
from constructs_lib.user_data import render_bootstrap_commands


def test_ubuntu_installs_its_own_packages_and_builds_nothing() -> None:
    family = IMAGE_FAMILIES["ubuntu"]
    lines = render_bootstrap_commands(
        asset_s3_url="s3://b/k", agent_settings={"role": "worker"},
        slurm_install=family.slurm_install, slurm_from_source=family.slurm_from_source)
    (line,) = [x for x in lines if x.startswith("command -v slurmd")]
    assert "apt-get install -y -q munge slurmd slurmctld slurmdbd slurm-client" in line
    assert "slurm_build" not in line and "dnf" not in line
    # a native cluster's user data has no Slurm line at all
    assert not [x for x in render_bootstrap_commands(
        asset_s3_url="s3://b/k", agent_settings={}) if "slurm" in x]


def test_every_family_says_how_it_gets_slurm() -> None:
    for name, family in IMAGE_FAMILIES.items():
        assert family.slurm_install, name


def test_the_sources_are_pinned_by_version_and_digest() -> None:
    assert [s.name for s in sb.SOURCES] == ["munge", "slurm"]  # Slurm links against munge
    for s in sb.SOURCES:
        assert re.fullmatch(r"[0-9a-f]{64}", s.sha256), s
        assert s.url.startswith("https://github.com/")
        assert s.version in s.url or s.version.replace(".", "-") in s.url, s
    assert "--with-munge=/usr" in sb.SLURM.configure


def tarball(path: Path, members: dict[str, bytes], mode: int = 0o644) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def source_at(path: Path, data: bytes, sha256: str | None = None) -> sb.Source:
    return sb.Source("pkg", "1.0", path.as_uri(), sha256 or hashlib.sha256(data).hexdigest(),
                     ("--prefix=/usr",), user="root", home="/root")


def test_a_source_whose_bytes_differ_is_refused_and_removed(tmp_path: Path) -> None:
    data = tarball(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/configure": b"#!/bin/sh\n"})
    bad = source_at(tmp_path / "pkg-1.0.tar.gz", data, sha256="0" * 64)
    with pytest.raises(sb.BuildError, match=r"has SHA-256 [0-9a-f]{64}, expected 0{64}; "
                                            "refused"):
        sb.fetch(bad, tmp_path / "work")
    assert not (tmp_path / "work" / "pkg-1.0.tar.gz").exists()
    good = sb.fetch(source_at(tmp_path / "pkg-1.0.tar.gz", data), tmp_path / "work")
    assert good.read_bytes() == data


def test_a_failed_download_is_tried_again_then_named(tmp_path: Path) -> None:
    waits: list[float] = []
    missing = source_at(tmp_path / "nowhere.tar.gz", b"")
    with pytest.raises(sb.BuildError, match=f"cannot download .*nowhere.tar.gz "
                                            f"\\({sb.DOWNLOAD_ATTEMPTS} attempts\\)"):
        sb.fetch(missing, tmp_path / "work", sleep=waits.append)
    assert waits == [sb.DOWNLOAD_FIRST_DELAY_SECONDS * 2 ** n
                     for n in range(sb.DOWNLOAD_ATTEMPTS - 1)]


def test_an_archive_reaching_outside_its_directory_is_refused(tmp_path: Path) -> None:
    tarball(tmp_path / "evil.tar.gz", {"pkg/../../escape": b"x"})
    with pytest.raises(sb.BuildError, match="refused to unpack"):
        sb.unpack(tmp_path / "evil.tar.gz", tmp_path / "out")
    assert not (tmp_path / "escape").exists()


def test_the_build_runs_configure_make_install_in_the_unpacked_tree(tmp_path: Path) -> None:
    data = tarball(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/configure": b"#!/bin/sh\n"}, 0o755)
    ran: list[tuple[list[str], Path]] = []

    def run(cmd, cwd=None, check=False):
        ran.append((cmd, cwd))
        return subprocess.CompletedProcess(cmd, 0)

    sb.build([source_at(tmp_path / "pkg-1.0.tar.gz", data)], tmp_path / "work", 3, run=run)
    assert [c for c, _ in ran] == [["./configure", "--prefix=/usr"], ["make", "-j3"],
                                   ["make", "install"], ["ldconfig"]]
    assert {cwd.name for _, cwd in ran} == {"pkg-1.0"}
    assert not (tmp_path / "work").exists()  # the node's disk is left clean


def test_a_failed_step_names_the_source_and_the_step(tmp_path: Path) -> None:
    data = tarball(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/configure": b"#!/bin/sh\n"})

    def run(cmd, cwd=None, check=False):
        if cmd[0] == "make":
            raise subprocess.CalledProcessError(2, cmd)
        return subprocess.CompletedProcess(cmd, 0)

    with pytest.raises(sb.BuildError, match=r"pkg 1\.0: make -j1 failed"):
        sb.build([source_at(tmp_path / "pkg-1.0.tar.gz", data)], tmp_path / "work", 1, run=run)

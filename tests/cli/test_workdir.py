"""``dlc submit --workdir``'s two ends without a cluster: what dlc packs (git's ignore rules
from .gitignore and .dlcignore, never .git/) and what dl-run unpacks (as the user, refusing
what escapes the job's directory); the document's parameter and its refusals."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli.fetch_workdir import LOCATION_RE
from bootstrap_scripts.jobs.cli.workdir import unpack
from bootstrap_scripts.jobs.engine.outcomes import RunError
from constructs_lib.operator_document import WORKDIR_PATTERN
from dlc import remote
from dlc.workdir import collect, pack
from tests.support.document import run_document_script


def tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_collect_follows_gitignore_and_dlcignore(tmp_path: Path) -> None:
    tree(tmp_path, {
        ".gitignore": "*.pyc\nbuild/\n/data.csv\n!keep.pyc\n",
        ".dlcignore": "secrets/\n",
        "train.py": "", "keep.pyc": "", "x.pyc": "", "data.csv": "", "build/out": "",
        "secrets/key": "", ".git/HEAD": "", "sub/data.csv": "", "sub/y.pyc": "",
        "sub/.dlcignore": "big.bin\n!y.pyc\n", "sub/big.bin": "", "sub/model.py": ""})
    assert collect(tmp_path) == [".dlcignore", ".gitignore", "keep.pyc", "sub/.dlcignore",
                                 "sub/data.csv", "sub/model.py", "sub/y.pyc", "train.py"]


def test_pack_and_unpack_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    tree(src, {"run.sh": "echo hi\n", "lib/a.py": "A = 1\n"})
    (src / "run.sh").chmod(0o755)
    archive = tmp_path / "w.tar.gz"
    pack(src, collect(src), archive)
    dest = tmp_path / "job" / "workdir"
    dest.parent.mkdir()
    with open(archive, "rb") as fh:
        assert unpack(fh, dest) == 2
    assert (dest / "lib/a.py").read_text() == "A = 1\n"
    assert (dest / "run.sh").stat().st_mode & 0o100


@pytest.mark.parametrize(("name", "link"), [("../escape", ""), ("ln", "/etc/passwd"),
                                            ("ln", "../../escape")])
def test_unpack_refuses_what_leaves_the_job_directory(tmp_path: Path, name: str,
                                                      link: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        if link:
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
        else:
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    buf.seek(0)
    (tmp_path / "job").mkdir()
    with pytest.raises(RunError, match="cannot unpack"):
        unpack(buf, tmp_path / "job" / "workdir")
    assert not (tmp_path / "escape").exists()


def test_the_location_pattern_is_the_documents() -> None:
    good = "dlclusterstack-bucket-abc/workdirs/alice/" + "0f" * 16 + ".tar.gz"
    for loc, ok in ((good, True), (good.replace("alice", "../x"), False),
                    (good.replace("workdirs", "other"), False), ("", False),
                    (good + "x", False), ("Bucket/workdirs/a/" + "0" * 32 + ".tar.gz", False)):
        assert (LOCATION_RE.match(loc) is not None) == ok, loc
        assert (re.search(WORKDIR_PATTERN, loc) is not None) == ok or loc == "", loc


def test_the_document_gives_a_workdir_to_dl_run_only(tmp_path: Path) -> None:
    good = "b-b-b/workdirs/alice/" + "0" * 32 + ".tar.gz"
    params = remote.document_parameters(["dl-jobs"], timeout=60, workdir=good)
    res = run_document_script(tmp_path, params, "#!/bin/sh\necho ran\n")
    assert res.returncode == 2 and b"workdir goes with dl-run only" in res.stderr
    assert res.stdout == b""

"""The rules root-run code follows in a user's files (``jobs/engine/userfiles.py``) and the
spec's words that name files (labels, addresses), checked without a cluster."""

from __future__ import annotations

import json
import os
import stat

import pytest

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec, JobSpecError
from bootstrap_scripts.protocol.paths import JobPaths

NOBODY = 65534


def spec_text(**share: object) -> str:
    proc = {"argv": ["true"], "label": share.pop("label", "")}
    return json.dumps({"job_id": "j-1", "launcher": "each",
                       "shares": [{"rank": 0, "address": "10.0.0.1", "procs": [proc],
                                   **share}]})


@pytest.mark.parametrize("label", ["../x", "a/b", "..", ".hidden", "x" * 33, "a b"])
def test_a_label_that_is_not_a_word_is_refused(label):
    with pytest.raises(JobSpecError, match="label"):
        JobSpec.from_json(spec_text(label=label))


@pytest.mark.parametrize("share", [{"address": "../../x"}, {"address": "a/b"},
                                   {"rank": -1}, {"rank": True}, {"rank": "0"}])
def test_an_address_or_rank_that_could_name_another_file_is_refused(share):
    with pytest.raises(JobSpecError):
        JobSpec.from_json(spec_text(**share))


def test_words_that_are_fine_pass():
    spec = JobSpec.from_json(spec_text(label="rdzv-store"))
    assert spec.shares[0].procs[0].label == "rdzv-store"
    with pytest.raises(ProtocolError):
        JobPaths(__import__("pathlib").Path("/efs/jobs/j-1")).log(0, "../x")


def test_read_owned_refuses_a_link_and_reads_the_owners_file(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "spec.json").symlink_to(tmp_path / "real.json")
    with pytest.raises(userfiles.UnsafeUserFile, match="symbolic link"):
        userfiles.read_owned(tmp_path, "spec.json")
    owned = userfiles.read_owned(tmp_path, "real.json")
    assert (owned.text, owned.uid) == ("{}", os.geteuid())
    with pytest.raises(userfiles.UnsafeUserFile):
        userfiles.read_owned(tmp_path, "../real.json")
    link_dir = tmp_path.parent / f"{tmp_path.name}-link"
    link_dir.symlink_to(tmp_path)
    with pytest.raises(userfiles.UnsafeUserFile, match="symbolic link"):
        userfiles.read_owned(link_dir, "real.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_read_owned_refuses_a_file_not_its_directory_owners(tmp_path):
    (tmp_path / "spec.json").write_text("{}")
    os.chown(tmp_path / "spec.json", NOBODY, NOBODY)
    with pytest.raises(userfiles.UnsafeUserFile, match="belongs to uid"):
        userfiles.read_owned(tmp_path, "spec.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_as_user_writes_with_the_users_rights_and_comes_back(shared_tmp):
    tmp_path = shared_tmp / "root-only"  # the user may traverse it, not write in it
    tmp_path.mkdir(mode=0o755)
    with userfiles.as_user(NOBODY, NOBODY), pytest.raises(PermissionError):
        (tmp_path / "x").write_text("no")
    assert os.geteuid() == 0 and os.getegid() == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    with userfiles.as_user(NOBODY, NOBODY):
        os.close(userfiles.open_append(mine / "log"))
    st = (mine / "log").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o644)


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory over needs root")
def test_user_dir_is_made_by_root_and_handed_to_the_user(tmp_path):
    parent = tmp_path / "checkpoints"
    parent.mkdir(mode=0o755)
    made = userfiles.user_dir(parent, NOBODY, NOBODY)
    st = made.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o700)
    assert userfiles.user_dir(parent, NOBODY, NOBODY) == made  # again: the same, unchanged
    os.chmod(parent, 0o777)  # a parent others may write in: nothing made there
    with pytest.raises(userfiles.UnsafeUserFile, match="writable by nobody else"):
        userfiles.user_dir(parent, NOBODY, NOBODY)


def test_a_fifo_planted_as_a_record_does_not_block_a_reader(tmp_path):
    """A root daemon polls records in users' job directories: a FIFO there (no writer)
    must read as empty at once, not hang the daemon for every user."""
    from bootstrap_scripts.protocol import store

    os.mkfifo(tmp_path / "cancel")
    assert store.exists(tmp_path / "cancel")
    assert store.read_text(tmp_path / "cancel") == ""
    assert store.stamp(tmp_path / "cancel") is not None
